"""PNG figures of a study (matplotlib, Agg backend): every aggregated metric against every grid axis of two or more
values (one line per combination of the other axes), and every per-objective metric family (``xnli/*/accuracy``)
as bars per cell over the objectives. Error bars are the standard deviation over seeds. At most
:data:`MAX_FIGURES` are drawn: a study of many metrics would otherwise write hundreds of files.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from mtft.reporting.figures import log_scale, plt, save_figure
from mtft.study.aggregate import (
    CellResult,
    MetricStats,
    StudyResults,
    family,
    is_per_objective,
    objective,
)

MAX_FIGURES = 40
DPI = 110


@dataclass(frozen=True)
class Figure:
    file: str  # the file name under the plots folder
    caption: str


def plot_study(results: StudyResults, folder: Path) -> tuple[list[Figure], int]:
    """Draw the study's figures into ``folder``; returns those drawn and how many the cap left out."""
    planned = _plan(results)
    for file, _, draw in planned[:MAX_FIGURES]:
        draw(folder / file)
    return [Figure(file, caption) for file, caption, _ in planned[:MAX_FIGURES]], max(0, len(planned) - MAX_FIGURES)


def slug(text: str) -> str:
    """``text`` as a safe file-name part: only ``[A-Za-z0-9_.-]``, at most 80 characters."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_.")[:80] or "x"


def _plan(results: StudyResults) -> list[tuple[str, str, Callable[[Path], None]]]:
    """(file, caption, drawer) of every figure that has data, axis figures first."""
    planned: list[tuple[str, str, Callable[[Path], None]]] = []
    used: set[str] = set()
    with_data = [m for m in results.metrics if any(c.metrics[m].n for c in results.cells)]
    known = [c for c in results.cells if c.axes]
    for axis in results.axes:
        if len(_values(known, axis)) < 2:
            continue
        for metric in (m for m in with_data if not is_per_objective(m)):
            file = _unique(f"{slug(metric)}__vs__{slug(axis)}.png", used)
            planned.append((file, f"{metric} against {axis}", _bind(_draw_axis, known, axis, metric)))
    families: dict[str, list[str]] = {}
    for metric in (m for m in with_data if is_per_objective(m)):
        families.setdefault(family(metric), []).append(metric)
    for name, members in families.items():
        file = _unique(f"objectives__{slug(name)}.png", used)
        planned.append((file, f"{name} per objective and cell", _bind(_draw_family, results.cells, name, members)))
    return planned


def _bind(draw: Callable[..., None], *args: Any) -> Callable[[Path], None]:
    return lambda path: draw(*args, path)


def _unique(file: str, used: set[str]) -> str:
    stem, n = file.removesuffix(".png"), 2
    while file in used:  # two metrics with one slug (xnli/acc, xnli_acc)
        file, n = f"{stem}-{n}.png", n + 1
    used.add(file)
    return file


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _values(cells: list[CellResult], axis: str) -> list[Any]:
    """The axis's distinct values: sorted when numbers, else in the cells' order."""
    values = list({_key(c.axes.get(axis)): c.axes.get(axis) for c in cells}.values())
    return sorted(values) if all(_is_number(v) for v in values) else values


def axis_scale(values: list[Any]) -> str:
    """How an axis's values are laid out: ``log`` for positive numbers spanning 10× or more, ``linear`` for other
    numbers, ``category`` (evenly spaced, in order) for anything else."""
    if not all(_is_number(v) for v in values):
        return "category"
    return "log" if min(values) > 0 and max(values) >= 10 * min(values) else "linear"


def _mean(stats: MetricStats) -> float:
    return math.nan if stats.mean is None else stats.mean


def _draw_axis(cells: list[CellResult], axis: str, metric: str, path: Path) -> None:
    values = _values(cells, axis)
    scale = axis_scale(values)
    numeric = scale != "category"
    x = {_key(v): (v if numeric else i) for i, v in enumerate(values)}
    lines: dict[str, list[CellResult]] = {}
    for cell in cells:
        others = ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in cell.axes.items() if k != axis)
        lines.setdefault(others, []).append(cell)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for j, (label, members) in enumerate(lines.items()):
        members = sorted(members, key=lambda c: x[_key(c.axes.get(axis))])
        # categories: points side by side (no line, which would suggest an order between them)
        shift = (j - (len(lines) - 1) / 2) * min(0.1, 0.6 / len(lines)) if scale == "category" else 0.0
        ax.errorbar(
            [x[_key(c.axes.get(axis))] + shift for c in members],
            [_mean(c.metrics[metric]) for c in members],
            yerr=[c.metrics[metric].std or 0.0 for c in members],
            marker="o",
            ms=4,
            capsize=3,
            ls="none" if scale == "category" else "-",
            label=label or None,
        )
    if scale == "log":
        log_scale(ax, "x")
    if scale == "category":
        ax.set_xticks(range(len(values)), [str(v) for v in values], rotation=20 if len(values) > 4 else 0)
        ax.set_xlim(-0.5, len(values) - 0.5)
    ax.set_xlabel(axis)
    ax.set_ylabel(f"{metric}\n(mean ± std over seeds)")
    ax.grid(alpha=0.3)
    if len(lines) > 1:
        ax.legend(fontsize=7)
    save_figure(fig, path, DPI)


def _draw_family(cells: list[CellResult], name: str, members: list[str], path: Path) -> None:
    shown = [c for c in cells if any(c.metrics[m].n for m in members)]
    objectives = [objective(m) for m in members]
    positions = np.arange(len(members))
    width = 0.8 / len(shown)
    fig, ax = plt.subplots(figsize=(min(30.0, max(6.4, 1.5 + len(members) * (0.3 + 0.2 * len(shown)))), 4.2))
    for i, cell in enumerate(shown):
        ax.bar(
            positions + (i - (len(shown) - 1) / 2) * width,
            [_mean(cell.metrics[m]) for m in members],
            width,
            yerr=[cell.metrics[m].std or 0.0 for m in members],
            capsize=2,
            label=cell.name,
        )
    ax.set_xticks(positions, objectives)
    ax.set_xlabel("objective")
    ax.set_ylabel(f"{name}\n(mean ± std over seeds)")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7)
    save_figure(fig, path, DPI)
