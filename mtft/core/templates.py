"""Templates in the user's strings: ``{field}`` placeholders and nothing more.

``str.format`` on a string the user wrote runs a small language: ``{language:>999999999}`` allocates gigabytes,
``{language.__class__}`` and ``{language[0]}`` reach attributes and items, ``{foo}`` is a KeyError. So a template
(a dataset config name with ``{language}``, a ``data.sources`` pattern with ``{name}`` and ``{split}``, ...) is
checked when its setting is read (:func:`check_template`: known placeholders only, no format spec, no
conversion, no attribute or index, balanced braces) and filled by plain substitution (:func:`fill_template`),
never by ``str.format``. ``{{`` and ``}}`` stay the escapes of a literal brace, as in ``str.format``.
"""

from __future__ import annotations

import string
from functools import lru_cache
from typing import Any, Collection, Mapping, Optional

from mtft.core.errors import ConfigError, echo


class TemplateError(ConfigError, ValueError):
    """A template the user wrote is refused; a ValueError too, so that a pydantic validator reports it."""


@lru_cache(maxsize=256)
def _parse(value: str) -> tuple[tuple[str, Optional[str], Optional[str], Optional[str]], ...]:
    return tuple(string.Formatter().parse(value))


def _allowed_words(allowed: Optional[Collection[str]]) -> str:
    if allowed is None:
        return "plain {name} placeholders"
    return "placeholders: " + (", ".join("{" + f + "}" for f in sorted(allowed)) or "none")


def check_template(value: str, allowed: Optional[Collection[str]], what: Optional[str]) -> list[str]:
    """The placeholders of ``value`` (in order, repeats kept), or a :class:`TemplateError` in one line: ``what``
    (the setting), the fault, the allowed placeholders and ``value`` shortened. ``what`` None leaves out the setting
    and the value, for a pydantic validator (the config loader names both).

    ``allowed`` None admits any plain identifier (a template over a dataset's columns, known only later)."""

    def refuse(problem: str) -> TemplateError:
        message = f"{problem}; allowed {_allowed_words(allowed)}"
        return TemplateError(message if what is None else f"{what}: {message} (got {echo(value)})")

    try:
        parsed = _parse(value)
    except ValueError as exc:  # a lone brace, or a brace inside a field name
        raise refuse(f"{exc} (a literal brace is written {{{{ or }}}})") from None
    fields = []
    for _, field, spec, conversion in parsed:
        if field is None:
            continue
        problem = ""
        if not field.isidentifier():
            problem = f"{{{field}}} is not a plain name (no attribute, index, position or blank)"
        elif allowed is not None and field not in allowed:
            problem = f"unknown placeholder {{{field}}}"
        elif conversion:
            problem = f"{{{field}!{conversion}}}: a conversion is not allowed"
        elif spec:
            problem = f"{{{field}:...}}: a format spec is not allowed"
        if problem:
            raise refuse(problem)
        fields.append(field)
    return fields


def fill_template(value: str, fields: Mapping[str, Any], what: str = "template") -> str:
    """``value`` with each ``{field}`` replaced by ``str(fields[field])``: plain substitution, after the same
    checks as :func:`check_template` with ``fields`` as the allowed placeholders."""
    check_template(value, fields.keys(), what)
    return "".join(literal + ("" if field is None else str(fields[field])) for literal, field, _, _ in _parse(value))
