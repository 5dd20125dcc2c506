"""The catastrophic-overtraining analysis (Springer et al., 2025, "Overtrained language models are harder to
fine-tune"): pre-training budgets × the other axes (fine-tuning learning rates), read from the runs' own logs.

Per run (from ``metrics.jsonl``): the backbone's budget and the learning rate its schedule ended at (the ``backbone``
row), L_p of θ_p before fine-tuning and λ_p (the ``lambda_p`` row), L_p after fine-tuning (the last ``forgetting``
row) and its change, the in-domain loss (the last ``train`` row's per-objective training loss: the fine-tuning
task's own loss on its training batches, averaged over the last logging window), and the Gaussian probe's ΔL_p(γ)
of θ_p and of θ_f (``probe`` rows). Per study: the inflection point of L_p after fine-tuning and of each task metric
per setting of the other axes (:mod:`mtft.study.inflection`), a bookkeeping table of the budgets, and the paper's
figures redrawn: L_p after fine-tuning, ΔL_p(γ) of θ_p, λ_p and the task metrics against the budget.

Study-file options (``analyses: {overtraining: {...}}``): ``budget_axis`` (default ``pretrain.tokens``),
``task_metrics`` (higher is better), ``tolerance`` (how much worse a larger budget must be to count).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional

import numpy as np
from pydantic import Field

from mtft.core.atomic import write_json
from mtft.reporting.figures import log_scale, plt, save_figure
from mtft.study.aggregate import StudyResults
from mtft.study.analysis import AnalysisOptions, StudyAnalysis
from mtft.study.collect import log_rows
from mtft.study.inflection import Inflection, describe, find_inflections

LP_AFTER = "lp_after"
DPI = 110


class OvertrainingOptions(AnalysisOptions):
    budget_axis: str = Field("pretrain.tokens", description="The grid axis of the pre-training token budget.")
    task_metrics: list[str] = Field(
        default_factory=list, description="Task metrics (higher is better) whose inflection point is reported too."
    )
    tolerance: float = Field(
        0.0, ge=0.0, description="A larger budget counts as worse only when worse by more than this."
    )


class OvertrainingAnalysis(StudyAnalysis):
    Options = OvertrainingOptions
    name = "overtraining"
    options: OvertrainingOptions

    def check(self, axes: list[str]) -> None:
        if self.options.budget_axis not in axes:
            raise ValueError(
                f"overtraining: budget_axis {self.options.budget_axis!r} is not an axis of the study "
                f"(axes: {', '.join(axes) or 'none'})"
            )

    # ---------------------------------------------------------------------------------------------
    def run_metrics(self, run_dir: Path) -> dict[str, float]:
        return run_measures(Path(run_dir) / "metrics.jsonl")

    # ---------------------------------------------------------------------------------------------
    def write(self, folder: Path, link: str, records: list[dict[str, Any]], results: StudyResults) -> list[str]:
        axis = self.options.budget_axis
        measures = [(LP_AFTER, True)] + [(m, False) for m in self.options.task_metrics]
        found = {m: find_inflections(records, axis, m, lower, self.options.tolerance) for m, lower in measures}
        complete = [r for r in records if r["status"] == "complete"]
        points = {m: {_setting(i.group): i.point for i in items if i.point is not None} for m, items in found.items()}
        figures = draw_figures(folder, complete, axis, self.options.task_metrics, points)
        trends = sensitivity_trends(complete, axis)
        write_json(
            folder / "inflection.json",
            {
                "budget_axis": axis,
                "tolerance": self.options.tolerance,
                "inflections": {m: [i.to_json() for i in items] for m, items in found.items()},
                "budgets": budget_table(complete, axis),
                "trends": trends,
            },
        )
        return section(found, budget_table(complete, axis), figures, link, self.options.tolerance, trends)


# ------------------------------------------------------------------------------------------------------
def run_measures(path: Path) -> dict[str, float]:
    """The analysis's numbers of one run from its ``metrics.jsonl`` (nothing for what the run did not log)."""
    out: dict[str, float] = {}
    last: dict[str, dict[str, Any]] = {}
    for row in log_rows(path):
        kind = row.get("kind")
        if kind == "probe":
            model = {"pre-trained": "dlp_pretrained", "fine-tuned": "dlp_finetuned"}.get(row.get("model"))
            value = row.get("dlp/mean/mean")
            if model and _number(value) and _number(row.get("gamma")):
                out[f"{model}/g{row['gamma']:g}"] = float(value)
        elif kind in ("backbone", "lambda_p", "forgetting", "train"):
            last[kind] = row
    backbone = last.get("backbone", {})
    for key, name in (
        ("tokens_budget", "pretrain_tokens"),
        ("lr_after", "pretrain_lr_after"),
        ("seed", "pretrain_seed"),
    ):
        if _number(backbone.get(key)):
            out[name] = float(backbone[key])
    if _number(backbone.get("steps")) and _number(backbone.get("schedule_steps")):
        out["pretrain_schedule_left"] = float(backbone["schedule_steps"]) - float(backbone["steps"])
    eigen = last.get("lambda_p", {})
    if _number(eigen.get("lambda_p")):
        out["lambda_p"] = float(eigen["lambda_p"])
    before = _mean_of(eigen, "lp_pretrained/")
    after = _mean_of(last.get("forgetting", {}), "lp/")
    if before is not None:
        out["lp_before"] = before
    if after is not None:
        out[LP_AFTER] = after
    if before is not None and after is not None:
        out["lp_change"] = after - before
    for key, value in last.get("train", {}).items():
        if key.startswith("loss/") and _number(value):
            out["task_loss/" + key.removeprefix("loss/").replace("/", ".")] = float(value)
    return out


def _mean_of(row: dict[str, Any], prefix: str) -> Optional[float]:
    """The mean over languages of ``<prefix><lang>`` (one adapter's keys only: ``lp/en``, not ``lp/xnli/en``)."""
    values = [float(v) for k, v in row.items() if k.startswith(prefix) and "/" not in k[len(prefix) :] and _number(v)]
    return sum(values) / len(values) if values else None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# ------------------------------------------------------------------------------------------------------
def budget_table(records: list[dict[str, Any]], axis: str) -> list[dict[str, Any]]:
    """Per budget: the budgets the runs' backbones report, the largest learning rate any backbone's schedule ended
    at, the schedule steps left after its checkpoint, L_p of θ_p and λ_p (their mean over runs) -- the bookkeeping
    that each budget is its own schedule annealed to zero."""
    rows = []
    for budget in sorted({float(r["axes"][axis]) for r in records if axis in r["axes"]}):
        mine = [r for r in records if float(r["axes"].get(axis, math.nan)) == budget]
        runs = [r["metrics"] for r in mine]
        row: dict[str, Any] = {"budget": budget, "runs": len(runs), "backbones": len(one_per_backbone(mine, axis))}
        row["backbone_tokens"] = sorted({m["pretrain_tokens"] for m in runs if "pretrain_tokens" in m})
        for key, reduce in (
            ("pretrain_lr_after", max),
            ("pretrain_schedule_left", max),
            ("lp_before", _mean),
            ("lambda_p", _mean),
        ):
            values = [m[key] for m in runs if key in m]  # a mean over runs: each backbone weighs its runs alike
            row[key] = reduce(values) if values else None
        rows.append(row)
    return rows


def sensitivity_trends(records: list[dict[str, Any]], axis: str) -> list[dict[str, Any]]:
    """Progressive sensitivity as a number: Spearman's rank correlation of each pre-trained model's λ_p and ΔL_p(γ)
    with its budget (one point per pre-trained model), over every budget and, separately, over the budgets from the
    one where the mean is lowest on -- the second is chosen after seeing the curve (post hoc) and says so."""
    from scipy.stats import spearmanr

    models = one_per_backbone(records, axis)
    keys = sorted({k for r in models for k in r["metrics"] if k == "lambda_p" or k.startswith("dlp_pretrained/")})
    out = []
    for key in keys:
        points = [(float(r["axes"][axis]), float(r["metrics"][key])) for r in models if _number(r["metrics"].get(key))]
        budgets, means, _ = _curve(models, axis, key)
        lowest = budgets[int(np.argmin(means))] if budgets else math.nan
        entry: dict[str, Any] = {"measure": key, "models": len(points), "lowest_mean_at": lowest}
        for name, subset in (("all", points), ("from_lowest", [p for p in points if p[0] >= lowest])):
            if len({b for b, _ in subset}) >= 3:
                rho, p_value = spearmanr([b for b, _ in subset], [v for _, v in subset])
                entry[name] = {"rho": float(rho), "p_value": float(p_value), "points": len(subset)}
            else:
                entry[name] = None
        out.append(entry)
    return out


def trend_section(trends: list[dict[str, Any]]) -> list[str]:
    if not trends:
        return []
    lines = [
        "### Progressive sensitivity: rank correlation with the budget",
        "",
        "Spearman's ρ of each pre-trained model's measure with its budget (one point per pre-trained model; "
        "mtft/study/overtraining.py). 'From its lowest mean' starts at the budget where the measure's mean is lowest: "
        "a range chosen after seeing the curve (post hoc), not a test planned in advance.",
        "",
        "| measure | models | ρ, all budgets (p) | lowest mean at | ρ, from its lowest mean (p, points) |",
        "|---|---:|---|---:|---|",
    ]
    for t in trends:
        every = "–" if t["all"] is None else f"{t['all']['rho']:+.2f} ({t['all']['p_value']:.2g})"
        tail = t["from_lowest"]
        after = "–" if tail is None else f"{tail['rho']:+.2f} ({tail['p_value']:.2g}, {tail['points']})"
        lines.append(f"| {t['measure']} | {t['models']} | {every} | {t['lowest_mean_at']:,.0f} | {after} |")
    return lines + [""]


def one_per_backbone(records: list[dict[str, Any]], axis: str) -> list[dict[str, Any]]:
    """One run per pre-trained model: the first run of each (budget, backbone seed). The pre-trained model's own
    numbers (L_p(θ_p), λ_p, ΔL_p of θ_p) are the same in every run fine-tuning it, so their spread is over
    backbones, not over runs that repeat one backbone's value (which would understate it)."""
    seen: set[tuple[Any, Any]] = set()
    out = []
    for r in records:
        key = (r["axes"].get(axis), r["metrics"].get("pretrain_seed"))
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def _mean(values: list[float]) -> float:
    return float(np.mean(values))


def section(
    found: dict[str, list[Inflection]],
    budgets: list[dict[str, Any]],
    figures: list[tuple[str, str]],
    link: str,
    tol,
    trends: Optional[list[dict[str, Any]]] = None,
) -> list[str]:
    lines = [
        "## Overtraining: inflection points",
        "",
        "Per setting of the other axes, the smallest pre-training budget at which the measure is at its best when a "
        f"larger budget is worse (by more than {tol:g}); 'none within the budgets tried' when the largest budget is "
        "still the best. Point estimate: on the seed-mean curve; uncertainty: each seed's own curve "
        "(mtft/study/inflection.py).",
        "",
        "| measure | setting | inflection point (tokens) |",
        "|---|---|---|",
    ]
    for measure, items in found.items():
        for item in items:
            lines.append(f"| {measure} | {_setting(item.group) or '–'} | {describe(item)} |")
    lines += [
        "",
        "### Budgets (bookkeeping)",
        "",
        "| budget | runs | pre-trained models | backbone's budget | lr after its last step (max) | "
        "schedule steps left (max) | L_p(θ_p) | λ_p |",
        "|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for row in budgets:
        tokens = ", ".join(f"{t:,.0f}" for t in row["backbone_tokens"]) or "not recorded"
        cells = [_fmt(row[k]) for k in ("pretrain_lr_after", "pretrain_schedule_left", "lp_before", "lambda_p")]
        lines.append(
            f"| {row['budget']:,.0f} | {row['runs']} | {row['backbones']} | {tokens} | " + " | ".join(cells) + " |"
        )
    lines += [""] + trend_section(trends or [])
    lines += [f"Numbers: [`{link}/inflection.json`]({link}/inflection.json).", ""]
    lines += [f"![{caption}]({link}/{file})" for file, caption in figures]
    return lines + [""]


def _setting(axes: dict[str, Any], leave_out: str = "", also: Optional[str] = None) -> str:
    """The other axes' values as a label: ``lr=0.001`` (the last part of each dotted key)."""
    return ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in axes.items() if k not in (leave_out, also))


def _fmt(value: Optional[float]) -> str:
    return "–" if value is None else f"{value:.4g}"


# ------------------------------------------------------------------------------------------------------
def draw_figures(
    folder: Path,
    records: list[dict[str, Any]],
    axis: str,
    task_metrics: list[str],
    points: Optional[dict[str, dict[str, float]]] = None,
) -> list[tuple[str, str]]:
    """(file, caption) of the figures drawn: (a) L_p after fine-tuning per learning rate, (b) ΔL_p(γ) of θ_p per γ,
    (c) λ_p, (d) each task metric per learning rate -- all against the budget; mean ± std over seeds. ``points``:
    measure -> setting label -> the inflection point of its seed-mean curve, marked with a star."""
    figures = []
    points = points or {}
    if _has(records, LP_AFTER):
        _by_group(records, axis, LP_AFTER, folder / "a_lp_after.png", "lp_before", points.get(LP_AFTER, {}))
        figures.append(("a_lp_after.png", "(a) pre-training loss L_p after fine-tuning against the budget"))
    gammas = sorted(
        {k for r in records for k in r["metrics"] if k.startswith("dlp_pretrained/")},
        key=lambda k: float(k.split("/g")[1]),
    )
    if gammas:
        _per_budget(
            one_per_backbone(records, axis), axis, gammas, folder / "b_probe.png", "ΔL_p of θ_p under Gaussian noise"
        )
        figures.append(("b_probe.png", "(b) ΔL_p(γ) of the pre-trained checkpoint against the budget"))
    if _has(records, "lambda_p"):
        _per_budget(one_per_backbone(records, axis), axis, ["lambda_p"], folder / "c_lambda_p.png", "λ_p of θ_p")
        figures.append(("c_lambda_p.png", "(c) λ_p of the pre-trained checkpoint against the budget"))
    for index, metric in enumerate(m for m in task_metrics if _has(records, m)):
        file = f"d{index + 1}_{metric.replace('/', '_')}.png"
        _by_group(records, axis, metric, folder / file, points=points.get(metric, {}))
        figures.append((file, f"(d) {metric} after fine-tuning against the budget"))
    return figures


def _has(records: list[dict[str, Any]], metric: str) -> bool:
    return any(_number(r["metrics"].get(metric)) for r in records)


def _curve(runs: list[dict[str, Any]], axis: str, metric: str) -> tuple[list[float], list[float], list[float]]:
    by_budget: dict[float, list[float]] = {}
    for r in runs:
        if _number(r["metrics"].get(metric)):
            by_budget.setdefault(float(r["axes"][axis]), []).append(float(r["metrics"][metric]))
    budgets = sorted(by_budget)
    means = [float(np.mean(by_budget[b])) for b in budgets]
    stds = [float(np.std(by_budget[b], ddof=1)) if len(by_budget[b]) > 1 else 0.0 for b in budgets]
    return budgets, means, stds


def _by_group(
    records: list[dict[str, Any]],
    axis: str,
    metric: str,
    path: Path,
    reference: str = "",
    points: Optional[dict[str, float]] = None,
) -> None:
    """One curve per setting of the other axes; with two or more other axes, one panel per value of the first
    (e.g. the regularisation level), the curves of a panel the rest (the learning rates), on a shared y axis."""
    others = [a for a in records[0]["axes"] if a != axis] if records else []
    panel_axis = others[0] if len(others) > 1 else None
    panels: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        panels.setdefault("" if panel_axis is None else f"{panel_axis}={r['axes'][panel_axis]}", []).append(r)
    fig, axes = plt.subplots(1, len(panels), figsize=(6.4 * len(panels), 4.2), sharey=True, squeeze=False)
    for ax, (title, runs) in zip(axes[0], panels.items()):
        _draw_groups(ax, runs, axis, metric, points or {}, panel_axis)
        if reference and _has(runs, reference):
            x, y, _ = _curve(runs, axis, reference)
            ax.plot(x, y, "k--", lw=1, label="before fine-tuning (θ_p)")
        if title:
            ax.set_title(title.split("=")[0].rsplit(".", 1)[-1] + "=" + title.split("=", 1)[1], fontsize=9)
    for index, ax in enumerate(axes[0]):
        _style(ax, axis, f"{metric}\n(mean ± std over seeds)" if index == 0 else "")
    save_figure(fig, path, DPI)


def _style(ax: Any, axis: str, ylabel: str) -> None:
    log_scale(ax, "x")
    ax.set_xlabel(f"{axis} (pre-training tokens)")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def _draw_groups(
    ax: Any, runs: list[dict[str, Any]], axis: str, metric: str, points: dict[str, float], panel_axis: Optional[str]
) -> None:
    """A panel's curves, one per setting of the other axes; a star on a curve's inflection point (``points`` is
    keyed by the full setting label, the panel's axis included)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault(_setting(r["axes"], leave_out=axis), []).append(r)
    marked = False
    for label, members in sorted(groups.items()):
        x, y, err = _curve(members, axis, metric)
        shown = _setting(members[0]["axes"], leave_out=axis, also=panel_axis) if panel_axis else label
        line = ax.errorbar(x, y, yerr=err, marker="o", ms=4, capsize=3, label=shown or metric)
        point = points.get(label)
        if point in x:
            star = "inflection point (seed mean)" if not marked else None
            ax.plot([point], [y[x.index(point)]], "*", ms=14, color=line[0].get_color(), mec="k", label=star)
            marked = True


def _per_budget(records: list[dict[str, Any]], axis: str, metrics: list[str], path: Path, ylabel: str) -> None:
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for metric in metrics:
        x, y, err = _curve(records, axis, metric)
        label = f"γ = {metric.split('/g')[1]}" if "/g" in metric else metric
        ax.errorbar(x, y, yerr=err, marker="o", ms=4, capsize=3, label=label)
    _finish(fig, ax, axis, f"{ylabel}\n(mean ± std over pre-trained models)", path)


def _finish(fig: Any, ax: Any, axis: str, ylabel: str, path: Path) -> None:
    _style(ax, axis, ylabel)
    save_figure(fig, path, DPI)
