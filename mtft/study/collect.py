"""What each run of a study produced, as one flat record: its metrics and its forgetting summaries.

Read from the run directories themselves (``metrics.json``, ``metrics.jsonl``) and the study's status files, so
that ``--report-only`` re-aggregates from disk and a run finished by hand counts like any other.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Sequence

from mtft.core.errors import shorten
from mtft.study.aggregate import run_record
from mtft.study.plan import PlannedRun
from mtft.study.state import is_finished, is_started, read_status, recovered_status, status_path

Extra = Callable[[Path], dict[str, float]]  # a study analysis's numbers of one run directory


def collect(root: Path, runs: list[PlannedRun], extra: Sequence[Extra] = ()) -> list[dict[str, Any]]:
    return [record_of(root, run, extra) for run in runs]


def record_of(root: Path, run: PlannedRun, extra: Sequence[Extra] = ()) -> dict[str, Any]:
    """The run's record: complete (with its metrics and ``extra``'s), failed (with its error line) or pending.

    A finished run whose ``metrics.json`` cannot be read (torn by a kill or a full disk, edited by hand) is never
    read as complete: it is failed, its error line naming the file, and marked ``damaged`` so that the study says
    so on stderr too."""
    path = status_path(root, run)
    status = recovered_status(path, run.run_dir) or read_status(path)  # a run finished but never recorded
    cell, axes, seed, where = run.cell.name, run.cell.axes, run.seed, str(run.run_dir)
    if is_finished(run.run_dir):
        try:
            metrics = run_metrics(run.run_dir)
        except (OSError, ValueError) as error:  # torn or edited by hand: the run's numbers are lost
            lost = "metrics.json cannot be read; delete the run's folder to run it again"
            error_text = f"damaged record: {lost} ({type(error).__name__}: {shorten(str(error))})"
            return {**run_record(cell, axes, seed, "failed", error=error_text, run_dir=where), "damaged": True}
        for numbers in extra:
            metrics.update(numbers(run.run_dir))
        if "wall_s" in status:
            metrics["wall_s"] = float(status["wall_s"])
        code = [version.get("source") for version in status.get("code", []) if version.get("source")]
        return run_record(cell, axes, seed, "complete", metrics, run_dir=where, code=code)
    if status.get("status") == "failed":
        return run_record(cell, axes, seed, "failed", error=status.get("error") or "failed", run_dir=where)
    started = "interrupted; resumes from its checkpoint" if is_started(run.run_dir) else None
    return run_record(cell, axes, seed, "pending", error=started, run_dir=where)


def run_metrics(run_dir: Path) -> dict[str, float]:
    """Every number of ``metrics.json`` (but the step) and the run's forgetting summaries when it logged any."""
    final = json.loads((Path(run_dir) / "metrics.json").read_text(encoding="utf-8"))
    if not isinstance(final, dict):
        raise ValueError(f"holds a JSON {type(final).__name__}, not an object of metrics")
    metrics = {k: float(v) for k, v in final.items() if k != "step" and _is_number(v)}
    metrics.update(worst_languages(metrics))
    metrics.update(forgetting_summaries(Path(run_dir) / "metrics.jsonl"))
    metrics.update(descent_summary(Path(run_dir) / "metrics.jsonl"))
    return metrics


def worst_languages(metrics: dict[str, float]) -> dict[str, float]:
    """``<task>/worst_<metric>``: the lowest per-language value of each task metric (the language a method
    left behind; macro averages hide it)."""
    by_task: dict[tuple[str, str], list[float]] = {}
    for key, value in metrics.items():
        parts = key.split("/")
        if len(parts) == 3:
            by_task.setdefault((parts[0], parts[2]), []).append(value)
    return {f"{task}/worst_{metric}": min(values) for (task, metric), values in by_task.items()}


def forgetting_summaries(path: Path) -> dict[str, float]:
    """Final and maximum F_p, and the final ||θ_f − θ_p|| and Theorem-1 bounds, from the run's log rows. A method
    with one adapter per task logs them per task and language (``F_p/xnli/en``): the suffix is kept
    (``F_p_final/xnli/en``). With ``forgetting.retrieval``, also the cross-lingual retrieval accuracy at θ_p
    (``retrieval_pretrained``, per pair ``retrieval_pretrained/en-de``) and at the last measurement
    (``retrieval``, ``retrieval/en-de``, ``retrieval_drop``; per task adapter ``retrieval/xnli/en-de``)."""
    f_p: dict[str, list[float]] = {}
    last: dict[str, float] = {}
    for row in log_rows(path):
        kind = row.get("kind")
        if kind not in ("forgetting", "displacement", "lambda_p"):
            continue
        for key, value in row.items():
            name, _, suffix = key.partition("/")
            if not _is_number(value):
                continue
            if kind == "lambda_p":
                if name == "retrieval_pretrained":
                    last[key] = float(value)
            elif name == "F_p" and kind == "forgetting":
                f_p.setdefault(suffix, []).append(float(value))
            elif name in ("distance", "bound_path", "bound_displacement") or (
                kind == "forgetting" and name in ("retrieval", "retrieval_drop")
            ):
                last[key] = float(value)
    out = dict(last)
    for suffix, values in f_p.items():
        tail = f"/{suffix}" if suffix else ""
        out[f"F_p_final{tail}"], out[f"F_p_max{tail}"] = values[-1], max(values)
    return out


def descent_summary(path: Path) -> dict[str, float]:
    """``common_descent``: the fraction of the run's steps at which the update the optimizer applied decreased
    every objective's loss to first order (``gradients.descent_check``); nothing when the run did not check."""
    flags = [
        float(row["common_descent"])
        for row in log_rows(path)
        if row.get("kind") == "weighting" and "common_descent" in row
    ]
    return {"common_descent": sum(flags) / len(flags)} if flags else {}


def log_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a run's ``metrics.jsonl``; none when it cannot be read, a torn last line skipped."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    rows = []
    for line in lines:
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue  # a torn last line of a killed run
    return rows


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)  # NaN kept: a diverged run shows
