"""Names that become paths, and the one way an output path is built from them.

Task and language names are written into file names (``predictions/<split>/<task>/<lang>.jsonl``, an export's
adapter folders). A name is checked once where it is defined (:func:`check_name`: task files, the config), and
every path built from names goes through :func:`inside`, which refuses a result outside its root -- so a name
that slipped past the check (a plug-in's, a checkpoint's) still cannot write elsewhere.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from mtft.core.errors import ConfigError

NAME_RULE = "letters, digits, '_', '.', '-', starting with a letter or digit, no '..'"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def name_problem(name: object) -> str | None:
    """Why ``name`` cannot be a task or language name (it becomes a file name), or None if it can."""
    if not isinstance(name, str):
        return f"must be a string, got {type(name).__name__}"
    if len(name) > 100:
        return f"{name[:40]!r}... is longer than 100 characters"
    if not _NAME.fullmatch(name) or ".." in name:
        return f"{name!r} is not a valid name ({NAME_RULE})"
    return None


def name_value(name: object, what: str) -> str:
    """``name`` if valid, else a ValueError "<what> <problem>": the form a pydantic field validator raises."""
    problem = name_problem(name)
    if problem:
        raise ValueError(f"{what} {problem}")
    return name  # type: ignore[return-value]


def check_name(name: object, what: str) -> str:
    """``name`` if it is a valid task/language name, else a ConfigError naming ``what`` (e.g. 'task file x: task')."""
    problem = name_problem(name)
    if problem:
        raise ConfigError(f"{what}: {problem}")
    return name  # type: ignore[return-value]


def default_cache_dir() -> Path:
    """Where mtft keeps what runs reuse when no ``data.cache_dir`` is given: ``$MTFT_CACHE``, else ``~/.cache/mtft``."""
    return Path(os.environ.get("MTFT_CACHE") or Path.home() / ".cache" / "mtft")


def inside(root: str | Path, *parts: str) -> Path:
    """``root / part / ...``, refused (ConfigError) unless it stays strictly inside ``root``: no absolute part,
    no ``..``, no separator smuggled into a part."""
    root = Path(root)
    for part in parts:
        if not part or part in (".", "..") or "/" in part or "\\" in part or os.sep in part or "\0" in part:
            raise ConfigError(f"name {part!r} cannot be used in a path under {root} ({NAME_RULE})")
    path = root.joinpath(*parts)
    base = os.path.normpath(os.path.abspath(root))
    if os.path.commonpath([base, os.path.normpath(os.path.abspath(path))]) != base or path == root:
        raise ConfigError(f"{path} lies outside {root}")
    return path
