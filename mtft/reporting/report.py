"""The end-of-run Markdown report: what was trained, how the losses went, and the per-objective metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from mtft.reporting.curves import FILE as CURVES
from mtft.reporting.curves import plot_training_curves
from mtft.reporting.logs import read_metrics


@dataclass(frozen=True)
class TaskTable:
    """One task's table in the report: its metrics, the languages evaluated, which of them are targets (evaluated,
    never trained on; marked beside the source and target macros and the transfer gap) and its metric variant in
    words (e.g. seqeval mode, SQuAD v1.1 rules)."""

    metrics: list[str]
    languages: list[str]
    targets: list[str] = field(default_factory=list)
    variant: Optional[str] = None


MAJORITY = "majority_"  # the baseline's metric names: <task>/<language>/majority_<metric> (mtft.evaluation.majority)


def learnt_nothing(final: dict[str, Any]) -> Optional[str]:
    """One sentence when every per-language metric that has a majority-class baseline ends at or below it (a run
    that learnt nothing its tasks can show: a frozen random encoder, a learning rate too small), else None."""
    pairs = []
    for key, value in final.items():
        head, _, metric = key.rpartition("/")
        if head.count("/") == 1 and not metric.startswith(MAJORITY):
            baseline = final.get(f"{head}/{MAJORITY}{metric}")
            if isinstance(value, (int, float)) and isinstance(baseline, (int, float)):
                pairs.append((key, value, baseline))
    if not pairs or any(value > baseline + 1e-12 for _, value, baseline in pairs):
        return None
    return (
        f"Every objective ended at or below its majority-class baseline ({len(pairs)} metrics, e.g. {pairs[0][0]} = "
        f"{pairs[0][1]:.4f} against {pairs[0][2]:.4f}): the run learnt nothing its tasks can show"
    )


@dataclass
class Report:
    """What a run's (or an evaluation's) ``report.md`` says, built in one place by its writer and written by
    :meth:`write`: the title, the set-up table, the final metrics and one :class:`TaskTable` per task; a training run
    adds its objectives' mixing, the best checkpoint, the parameter table and the monitors' sections."""

    title: str
    setup: list[tuple[str, str]]
    final: dict[str, float]
    tasks: dict[str, TaskTable]
    objectives: list[dict[str, Any]] = field(default_factory=list)
    best: Optional[dict[str, Any]] = None
    parameters: Optional[list[tuple[str, int, int]]] = None
    sections: list[str] = field(default_factory=list)

    def write(self, run_dir: Path) -> Path:
        """``run_dir/report.md`` (the loss and weighting sections read from ``run_dir``'s metrics.jsonl)."""
        return _write(self, run_dir)


def _write(report: Report, run_dir: Path) -> Path:
    title, setup, objectives, final, best = report.title, report.setup, report.objectives, report.final, report.best
    parameters, sections = report.parameters, report.sections
    lines = [f"# Run report: {title}", ""]
    lines += ["## Setup", "", "| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in setup] + [""]
    if parameters:
        lines += ["## Parameters", "", "| part | stored | trainable |", "|---|---:|---:|"]
        lines += [f"| {part} | {stored:,} | {trainable:,} |" for part, stored, trainable in parameters] + [""]
    lines += ["## Training objectives", "", "| objective | training examples | mixing probability |", "|---|---:|---:|"]
    lines += [f"| {o['name']} | {o['examples']} | {o['probability']:.3f} |" for o in objectives] + [""]
    events = read_metrics(run_dir)
    lines += _loss_section(events)
    if plot_training_curves(events, run_dir / CURVES):
        lines += [f"![Training loss per objective and evaluation per task]({CURVES})", ""]
    lines += _weighting_section(events)
    lines += list(sections)  # e.g. the forgetting monitors' sections, with their plots
    lines += ["## Evaluation (final weights)", ""]
    nothing = learnt_nothing(final)
    if nothing:
        lines += [f"**{nothing}**", ""]
    for task, table in report.tasks.items():
        metrics = table.metrics
        header = "| language | " + " | ".join(metrics) + " |"
        lines += [f"### {task}", ""]
        if table.variant:
            lines += [f"Metric: {table.variant}.", ""]
        lines += [header, "|---|" + "---:|" * len(metrics)]
        roles = table.targets
        for lang in table.languages:
            name = f"{lang} ({'target' if lang in roles else 'source'})" if roles else lang
            lines.append(f"| {name} | " + " | ".join(_fmt(final.get(f"{task}/{lang}/{m}")) for m in metrics) + " |")
        lines.append(
            "| **macro average** | " + " | ".join(f"**{_fmt(final.get(f'{task}/{m}'))}**" for m in metrics) + " |"
        )
        if roles:  # mtft.evaluation.evaluate.add_macro_averages's names
            for label, part in _TRANSFER_ROWS:
                lines.append(f"| {label} | " + " | ".join(_fmt(final.get(f"{task}/{part}{m}")) for m in metrics) + " |")
        baseline = [final.get(f"{task}/majority_{m}") for m in metrics]  # mtft.evaluation.majority's names
        if any(v is not None for v in baseline):
            lines.append("| majority-class baseline (macro) | " + " | ".join(map(_fmt, baseline)) + " |")
        lines.append("")
    if best:
        lines += [
            "## Best checkpoint",
            "",
            f"`{best['metric']}` = {best['value']:.4f} at step {best['step']} (weights in `best/`).",
            "",
        ]
    path = run_dir / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


#: the rows of a task with target languages: label, and the prefix of the metric's name
_TRANSFER_ROWS = (
    ("source macro", "source_"),
    ("target macro", "target_"),
    ("transfer gap (source − target)", "transfer_gap_"),
)


def _loss_section(events: list[dict[str, Any]]) -> list[str]:
    train = [e for e in events if e["kind"] == "train"]
    if not train:
        return []
    keys = sorted(k.removeprefix("loss/") for k in train[0] if k.startswith("loss/"))
    picks = sorted({0, len(train) // 4, len(train) // 2, 3 * len(train) // 4, len(train) - 1})
    lines = [
        "## Training loss per objective",
        "",
        "| step | combined | " + " | ".join(keys) + " |",
        "|---:|---:|" + "---:|" * len(keys),
    ]
    for i in picks:
        e = train[i]
        cells = [_fmt(e.get(f"loss/{k}")) for k in keys]
        lines.append(f"| {e['step']} | {_fmt(e['loss'])} | " + " | ".join(cells) + " |")
    return lines + [""]


def _weighting_section(events: list[dict[str, Any]]) -> list[str]:
    """The weights chosen per objective and the Pareto-stationarity gauge, when a Gram weighting ran."""
    steps = [e for e in events if e["kind"] == "weighting"]
    if not steps:
        return []
    names = [k.removeprefix("weight/") for k in steps[0] if k.startswith("weight/")]
    picks = sorted({0, len(steps) // 4, len(steps) // 2, 3 * len(steps) // 4, len(steps) - 1})
    floor = max(float(e.get("floor", 0.0)) for e in steps)
    floored = floor > 0 and any("min_d_dot_g" in e for e in steps)
    extra = " min_t dᵀg_t |" if floored else ""
    lines = [
        "## Loss weighting",
        "",
        "Weights w* per objective, ||d||² = w*ᵀGw*, and the stationarity gauge ||d||² / mean_t ||g_t||² "
        "(0 at a Pareto-stationary point, Theorem 3); `fw_gap` certifies the solver's optimality.",
        "",
        "| step | " + " | ".join(names) + " | ‖d‖² | stationarity | fw_gap |" + extra + " solver ms |",
        "|---:|" + "---:|" * (len(names) + 4 + floored),
    ]
    for i in picks:
        e = steps[i]
        cells = [_fmt(e.get(f"weight/{n}")) for n in names]
        solver_ms = e.get("seconds", e.get("weighting_s"))
        lines.append(
            f"| {e['step']} | " + " | ".join(cells) + f" | {_sci(e.get('d_norm_sq'))} | "
            f"{_sci(e.get('stationarity'))} | {_sci(e.get('fw_gap'))} | "
            + (f"{_sci(e.get('min_d_dot_g'))} | " if floored else "")
            + f"{_fmt(None if solver_ms is None else solver_ms * 1e3)} |"
        )
    if floored:
        lines += _floor_note(steps, floor)
    lines += _metric_note(steps) + _descent_note(steps, names)
    lines += _dominance_note(steps, names, floor)
    skipped = [e for e in events if e["kind"] == "skipped"]
    if skipped:
        lines += [
            "",
            f"{len(skipped)} step(s) skipped: " + "; ".join(f"step {e['step']}: {e['reason']}" for e in skipped[:5]),
        ]
    stopped = [e for e in events if e["kind"] == "stopped"]
    if stopped:
        lines += ["", f"Training stopped at step {stopped[-1]['step']}: {stopped[-1]['reason']}."]
    return lines + [""]


def _floor_note(steps: list[dict[str, Any]], floor: float) -> list[str]:
    """What the collapse guard changes: every objective keeps weight, and Theorem 2's guarantee is gone.

    On the floored simplex (w_t ≥ β/T) the direction is no longer the min-norm element of the gradients' hull,
    so the common-descent guarantee of Mao et al. (2022, Theorem 2), dᵀg_t ≥ ||d||² for every t, does not hold:
    the report must not let a reader assume it, and says how often −d increased some objective's loss.
    """
    values = [float(e["min_d_dot_g"]) for e in steps if "min_d_dot_g" in e]
    negative = [v for v in values if v < 0]
    lines = [
        "",
        f"Collapse guard: weights on the floored simplex, every objective kept ≥ β/T of the weight (β = {floor:g}). "
        "Unlike β = 0 (LF-MLF itself), this direction is not guaranteed to decrease every objective (Theorem 2 "
        "holds only for β = 0): ",
    ]
    if negative:
        lines[-1] += (
            f"min_t dᵀg_t was negative -- some objective's loss rose to first order -- at {len(negative)} of "
            f"{len(values)} logged steps (lowest {min(negative):.2e})."
        )
    else:
        lines[-1] += f"here min_t dᵀg_t stayed ≥ 0 at all {len(values)} logged steps."
    return lines


def _metric_note(steps: list[dict[str, Any]]) -> list[str]:
    """Say in which inner product the Gram, ||d||² and the certificate are (``gradients.metric=optimizer``)."""
    flags = [e["metric_preconditioned"] for e in steps if "metric_preconditioned" in e]
    if not flags:
        return []
    return [
        "",
        "The Gram was formed in the optimizer's metric, G_ts = g_tᵀ diag(1/(√v̂+ε)) g_s with AdamW's second moments "
        f"(at {int(sum(flags))} of {len(flags)} steps; Euclidean where the optimizer had no state yet, or applies "
        "no preconditioner): ‖d‖², the stationarity gauge and the certificate are in that metric.",
    ]


def _descent_note(steps: list[dict[str, Any]], names: list[str]) -> list[str]:
    """How often the update actually applied decreased every objective to first order (``gradients.descent_check``)."""
    checked = [e for e in steps if "common_descent" in e]
    if not checked:
        return []
    common = sum(e["common_descent"] for e in checked)
    per_objective = []
    for n in names:
        values = [e[f"first_order/{n}"] for e in checked if e.get(f"first_order/{n}") == e.get(f"first_order/{n}")]
        if values:  # NaN (absent from a step) left out
            per_objective.append(f"{n} {sum(v < 0 for v in values) / len(values):.2f}")
    return [
        "",
        "First-order check of the update the optimizer applied (Δθ = θ_(k+1) − θ_k: momentum, the preconditioner, "
        f"clipping and weight decay included): every objective's loss decreased to first order (g_tᵀΔθ < 0 for "
        f"every t) at {int(common)} of {len(checked)} steps ({common / len(checked):.2f}). Fraction of steps that "
        "decreased each objective: " + ", ".join(per_objective) + ".",
    ]


DOMINANT_WEIGHT = 0.98


def _dominance_note(steps: list[dict[str, Any]], names: list[str], floor: float = 0.0) -> list[str]:
    """Say so when one objective took (almost) all the weight through the end of the run.

    Once an objective is fitted, its gradient is near zero and the min-norm element of the gradients' hull is
    about that gradient: d stays a common descent direction (Theorem 2), but one along which the other objectives
    barely move. The run is then Pareto-stationary in the sense of Theorem 3 -- which is not every objective
    being learnt -- and a reader of the report should not have to find that out from the weight table. With a
    floor β > 0 (a small one can still leave 0.98 to one objective) the note says only what happened.
    """
    if len(names) < 2 or len(steps) < 4:
        return []
    leader = max(names, key=lambda n: steps[-1].get(f"weight/{n}", 0.0))
    weights = [e.get(f"weight/{leader}", 0.0) for e in steps]
    since, total = None, 0.0
    for i in range(len(steps) - 1, -1, -1):  # the earliest step from which the leader's mean weight is dominant
        total += weights[i]
        if total / (len(steps) - i) >= DOMINANT_WEIGHT:
            since = i
    first, last = steps[0]["step"], steps[-1]["step"]
    if since is None or steps[since]["step"] > last - (last - first) / 4:
        return []  # no dominant objective, or only over the last quarter of the run
    mean = sum(weights[since:]) / (len(steps) - since)
    took = f"From step {steps[since]['step']} to the end, **{leader}** took {mean:.3f} of the weight on average"
    if floor > 0:
        return ["", f"{took}, with the floor β = {floor:g} holding each other objective at ≥ β/T of the weight."]
    return [
        "",
        f"{took}: once an objective is fitted its gradient is near zero, the min-norm direction is about "
        "that gradient alone, and the other objectives barely move -- Pareto stationarity (Theorem 3), not "
        "every objective learnt. `weighting.stationarity_eps` stops a run there; `weighting.options.floor` "
        "(e.g. 0.1: every weight ≥ 0.1/T) guards against it; `weighting.method=mean` or `mgda_normalized` compare.",
    ]


def _sci(value: Optional[float]) -> str:
    return "–" if value is None else f"{value + 0.0:.2e}"  # + 0.0 turns -0.0 into 0.0


def _fmt(value: Optional[float]) -> str:
    return "–" if value is None else f"{value:.4f}"
