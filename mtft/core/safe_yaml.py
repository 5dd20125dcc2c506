"""Reading the user's text files: configs and task files are UTF-8, safe YAML without anchors or aliases.

Safe YAML builds no objects, but an alias still repeats a value by reference: a 1 KB file of nested aliases
expands to millions of items (and to a message as long, were it echoed in an error). Configs and task files
never need them, so an anchor or alias is refused with its line number.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from mtft.core.errors import ConfigError, UserError
from mtft.core.utf8 import position

# libyaml's parser where PyYAML was built with it (the usual wheels): ten times the pure-Python one, which a run pays
# on every task file it discovers; the same safe constructor and resolver either way
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _refuse_aliases(text: str) -> None:
    """Raise :class:`_AliasFound` at the first anchor or alias: a pass over the parser's events, which never
    expands an alias (so a file of nested aliases costs its own length, not their expansion)."""
    for event in yaml.parse(text, Loader=_SafeLoader):
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise _AliasFound(event.start_mark)


class _AliasFound(Exception):
    def __init__(self, mark: Any):
        super().__init__()
        self.mark = mark


def read_text(path: str | Path, what: str, error: type[UserError] = ConfigError) -> str:
    """The UTF-8 text of ``path`` (``what``: e.g. 'config file'); one clear ``error`` if it is missing, a
    directory, unreadable or not UTF-8."""
    path = Path(path)
    if path.is_dir():
        raise error(f"{what} {path} is a directory, not a file")
    if not path.is_file():
        raise error(f"{what} not found: {path}")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        where = position(exc.start, exc.object[: exc.start].count(b"\n"))
        raise error(f"{what} {path} is not UTF-8 text ({where})") from None
    except OSError as exc:
        raise error(f"{what} {path} cannot be read: {exc.strerror or exc}") from None


def load_yaml(text: str, source: str) -> Any:
    """Parse ``text`` as safe YAML without anchors/aliases; errors name ``source`` and the line, on one line."""
    try:
        _refuse_aliases(text)
        return yaml.load(text, Loader=_SafeLoader)  # noqa: S506 - libyaml's SafeLoader, or PyYAML's
    except _AliasFound as exc:
        raise ConfigError(
            f"{source}: YAML anchors and aliases (&name, *name) are not allowed (line {exc.mark.line + 1}); "
            "write the value out"
        ) from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" (line {where.line + 1}, column {where.column + 1})" if where else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{source}: malformed YAML{line}: {problem}") from None
    except RecursionError:
        raise ConfigError(f"{source}: YAML nested too deeply") from None
