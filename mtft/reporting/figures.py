"""What every PNG figure of mtft shares (a run's report, a study's, the overtraining analysis): the Agg backend, log
axes labelled in plain text, and one way to lay a figure out and save it.

Why log labels are not matplotlib's own: its log-axis labels are mathtext (``$\\mathdefault{10^{-3}}$``), and
the first such label a process draws builds matplotlib's mathtext parser (pyparsing), then parses each new label.
:class:`TextLogFormatter` gives the same labels (10⁻³, 2×10⁻¹ on a short range) as Unicode text, which the Agg
renderer lays out without a parser: the first log figure of a process takes about 0.1 s less (``python
bench/figures.py``: fastest of 9, 293 -> 194 ms over one decade, 354 -> 246 ms over four; the medians move by
±0.1 s from run to run on a 2-core machine), which every short LF-MLF run pays for its Pareto-stationarity gauge.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import IO, Any, Union

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
from matplotlib import ticker  # noqa: E402

_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")
_MATHDEFAULT = re.compile(r"\$\\mathdefault\{(.*)\}\$")
_POWER = re.compile(r"\^\{(-?\d+)\}")


def as_text(label: str) -> str:
    """A log-axis label of matplotlib's (``$\\mathdefault{2\\times10^{-1}}$``) as Unicode text (``2×10⁻¹``); a
    label that is not one of the forms it writes is returned unchanged, to be drawn as mathtext."""
    match = _MATHDEFAULT.fullmatch(label)
    if match is None:
        return label
    body = _POWER.sub(
        lambda power: power.group(1).translate(_SUPERSCRIPT), match.group(1).replace(r"\times", "\u2009×\u2009")
    )
    if any(mark in body for mark in "\\^{}$"):
        return label
    return "−" + body[1:] if body.startswith("-") else body  # the typographic minus, as matplotlib draws one


class TextLogFormatter(ticker.LogFormatterSciNotation):
    """matplotlib's labels of a log or symlog axis -- which ticks it labels, decades and, on a short range, the
    minor ticks -- written as text instead of mathtext (see the module's docstring)."""

    def __call__(self, x: float, pos: Any = None) -> str:
        return as_text(super().__call__(x, pos))


def log_scale(ax: Any, axis: str = "y", **scale: Any) -> None:
    """``ax.set_xscale``/``set_yscale("log", **scale)`` (``scale``: e.g. ``{"base": 2}``, or ``kind="symlog"``
    with ``linthresh``), labelled by :class:`TextLogFormatter` in place of the scale's mathtext formatters."""
    kind = scale.pop("kind", "log")
    (ax.set_xscale if axis == "x" else ax.set_yscale)(kind, **scale)
    target = ax.xaxis if axis == "x" else ax.yaxis
    base = target.get_transform().base  # a symlog formatter finds linthresh on the transform too
    for get, set_ in (
        (target.get_major_formatter, target.set_major_formatter),
        (target.get_minor_formatter, target.set_minor_formatter),
    ):
        old = get()
        if isinstance(old, ticker.LogFormatter):
            set_(TextLogFormatter(base, labelOnlyBase=old.labelOnlyBase, minor_thresholds=old.minor_thresholds))


def save_figure(fig: Any, path: Union[Path, IO[bytes]], dpi: int) -> Union[Path, IO[bytes]]:
    """Lay ``fig`` out (tight), write it as PNG to ``path`` (a path, or an open binary file: ``run.py probe``'s
    ``--out`` policy) and close it."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi, format="png")
    plt.close(fig)
    return path
