"""What each run of a study produced, as one flat record: its metrics and its forgetting summaries.

Read from the run directories themselves (``metrics.json``, ``metrics.jsonl``) and the study's status files, so
that ``--report-only`` re-aggregates from disk and a run finished by hand counts like any other.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mtft.study.plan import PlannedRun
from mtft.study.state import is_finished, is_started, read_status, status_path

# summaries of a run's forgetting rows (metrics.jsonl, kind "forgetting" / "displacement"), named for the tables
SUMMARIES = ("F_p_final", "F_p_max", "distance", "bound_path", "bound_displacement", "wall_s")


def collect(root: Path, runs: list[PlannedRun]) -> list[dict[str, Any]]:
    return [run_record(root, run) for run in runs]


def run_record(root: Path, run: PlannedRun) -> dict[str, Any]:
    status = read_status(status_path(root, run))
    record: dict[str, Any] = {
        "cell": run.cell.name,
        "axes": dict(run.cell.axes),
        "seed": run.seed,
        "run_dir": str(run.run_dir),
        "metrics": {},
        "error": None,
    }
    if is_finished(run.run_dir):
        record["status"] = "complete"
        record["metrics"] = run_metrics(run.run_dir)
        if "wall_s" in status:
            record["metrics"]["wall_s"] = float(status["wall_s"])
    elif status.get("status") == "failed":
        record["status"] = "failed"
        record["error"] = status.get("error") or "failed"
    else:
        record["status"] = "pending"
        if is_started(run.run_dir):
            record["error"] = "interrupted; resumes from its checkpoint"
    return record


def run_metrics(run_dir: Path) -> dict[str, float]:
    """Every number of ``metrics.json`` (but the step) and the run's forgetting summaries when it logged any."""
    final = json.loads((Path(run_dir) / "metrics.json").read_text(encoding="utf-8"))
    metrics = {k: float(v) for k, v in final.items() if k != "step" and _is_number(v)}
    metrics.update(forgetting_summaries(Path(run_dir) / "metrics.jsonl"))
    return metrics


def forgetting_summaries(path: Path) -> dict[str, float]:
    """Final and maximum F_p, and the final ||θ_f − θ_p|| and Theorem-1 bounds, from the run's log rows. A method
    with one adapter per task logs them per task and language (``F_p/xnli/en``): the suffix is kept
    (``F_p_final/xnli/en``)."""
    f_p: dict[str, list[float]] = {}
    last: dict[str, float] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return {}
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a torn last line of a killed run
        if row.get("kind") not in ("forgetting", "displacement"):
            continue
        for key, value in row.items():
            name, _, suffix = key.partition("/")
            if not _is_number(value):
                continue
            if name == "F_p" and row["kind"] == "forgetting":
                f_p.setdefault(suffix, []).append(float(value))
            elif name in ("distance", "bound_path", "bound_displacement"):
                last[key] = float(value)
    out = dict(last)
    for suffix, values in f_p.items():
        tail = f"/{suffix}" if suffix else ""
        out[f"F_p_final{tail}"], out[f"F_p_max{tail}"] = values[-1], max(values)
    return out


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)  # NaN kept: a diverged run shows
