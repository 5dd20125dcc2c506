"""A study's numbers: per cell and metric, mean ± sample standard deviation over the seeds, and each cell's paired
difference from its baseline cell (paired t-test).

The input is one record per (cell, seed), as the study collects them (:func:`run_record` builds one). Only complete
runs enter the numbers; failed runs are listed with their error line and pending ones counted. A NaN or infinite
value (a diverged run) is left out of the mean and counted per metric as ``nan``, never averaged in silently.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field
from fnmatch import fnmatchcase
from typing import Any, Optional, Sequence

import numpy as np
from scipy import stats

from mtft.study.failure import FailureRate, expand_failure_metrics, failure_rate

STATUSES = ("complete", "failed", "pending")
CONFIDENCE = 0.95
TEST = "paired t-test"
#: a run's summaries next to its evaluation metrics (the forgetting monitors' final and largest F_p, the final
#: distance ||θ − θ_p|| and Theorem-1 bounds, the wall time); per objective they are named ``F_p_final/xnli/en``
RUN_SUMMARIES = ("F_p_final", "F_p_max", "distance", "bound_path", "bound_displacement", "wall_s")


def run_record(
    cell: str,
    axes: dict[str, Any],
    seed: int,
    status: str = "complete",
    metrics: Optional[dict[str, float]] = None,
    error: Optional[str] = None,
    run_dir: Optional[str] = None,
    code: Optional[list[str]] = None,
) -> dict[str, Any]:
    """One run's record, the form :func:`aggregate` reads; ``code``: the source fingerprints it ran under."""
    return {
        "cell": cell,
        "axes": dict(axes),
        "seed": seed,
        "status": status,
        "error": error,
        "metrics": dict(metrics or {}),
        "run_dir": run_dir or f"runs/{cell}/seed-{seed}",
        "code": list(code or []),
    }


@dataclass
class MetricStats:
    """Over a cell's complete runs: ``n`` finite values (mean, sample std with ddof=1, min, max of those);
    ``nan`` runs whose value is NaN or infinite; ``missing`` runs without the metric."""

    n: int
    nan: int = 0
    missing: int = 0
    mean: Optional[float] = None
    std: Optional[float] = None
    min: Optional[float] = None
    max: Optional[float] = None


@dataclass
class FailedRun:
    run_dir: str
    seed: int
    error: str


@dataclass
class CellResult:
    name: str
    axes: dict[str, Any]
    complete: int
    failed: list[FailedRun]
    pending: list[str]  # run directories of the runs not (yet) finished
    metrics: dict[str, MetricStats]
    failures: dict[str, FailureRate] = field(default_factory=dict)  # the study's `failure` metrics


@dataclass
class PairedDifference:
    """``cell`` − ``baseline_cell`` on ``metric`` over the seeds both completed with a finite value; the confidence
    interval of the mean difference and the two-sided p-value come from the paired t-test (None below 2 pairs)."""

    cell: str
    baseline_cell: str
    metric: str
    n_pairs: int
    seeds: list[int]
    mean: Optional[float] = None
    std: Optional[float] = None
    ci_low: Optional[float] = None
    ci_high: Optional[float] = None
    p_value: Optional[float] = None


@dataclass
class StudyResults:
    axes: list[str]
    metrics: list[str]  # the study's patterns expanded against the runs' metric names
    baseline: Optional[dict[str, Any]]
    cells: list[CellResult]
    differences: list[PairedDifference]
    unmatched: list[str] = field(default_factory=list)  # metric patterns no complete run has
    no_partner: list[str] = field(default_factory=list)  # cells whose baseline partner is not in the study
    # source fingerprint -> complete runs that ran (in part) under it; "unrecorded" for runs from before it was kept
    code_versions: dict[str, int] = field(default_factory=dict)
    # the `failure` patterns expanded (metrics with a majority-class baseline), those matching nothing, and the
    # metrics matched that no run has a baseline of (regression, NER, QA)
    failure: list[str] = field(default_factory=list)
    failure_unmatched: list[str] = field(default_factory=list)
    failure_without_baseline: list[str] = field(default_factory=list)
    test: str = TEST
    confidence: float = CONFIDENCE

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict; strict JSON: a non-finite float (a mean that overflowed) becomes None."""
        return _finite_or_none(asdict(self))

    def cell(self, name: str) -> CellResult:
        return next(c for c in self.cells if c.name == name)

    def difference(self, cell: str, metric: str) -> Optional[PairedDifference]:
        return next((d for d in self.differences if d.cell == cell and d.metric == metric), None)


def aggregate(
    records: list[dict[str, Any]],
    axes: list[str],
    metrics: list[str],
    baseline: Optional[dict[str, Any]],
    cells: list[str],
    failure: Sequence[str] = (),
) -> StudyResults:
    """The study's :class:`StudyResults`; ``cells`` in display order, ``metrics`` and ``failure`` (the metrics whose
    failed-run rate is counted, :mod:`mtft.study.failure`) names or fnmatch patterns."""
    by_cell: dict[str, list[dict[str, Any]]] = {name: [] for name in cells}
    for record in records:
        if record["cell"] not in by_cell:
            raise ValueError(f"run record of cell {record['cell']!r}, which is not one of the study's cells")
        if record["status"] not in STATUSES:
            raise ValueError(f"run record {record['run_dir']}: status {record['status']!r} is not one of {STATUSES}")
        by_cell[record["cell"]].append(record)
    for name, mine in by_cell.items():
        seeds = [r["seed"] for r in mine]
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"cell {name!r} has two run records of one seed: {sorted(seeds)}")
        mine.sort(key=lambda r: r["seed"])
    complete = [r for r in records if r["status"] == "complete"]
    available = {key for r in complete for key in r["metrics"]}
    names, unmatched = expand_metrics(metrics, available)
    counted, failure_unmatched, without = expand_failure_metrics(failure, available)
    names += [metric for metric in counted if metric not in names]  # a metric counted is aggregated too
    results = [_cell_result(name, by_cell[name], names) for name in cells]
    differences, no_partner = _differences(results, by_cell, names, baseline)
    versions: dict[str, int] = {}
    for record in complete:
        for source in record.get("code") or ["unrecorded"]:
            versions[source] = versions.get(source, 0) + 1
    for cell in results:
        cell.failures = {metric: failure_rate(by_cell[cell.name], metric) for metric in counted}
    return StudyResults(
        list(axes),
        names,
        baseline,
        results,
        differences,
        unmatched,
        no_partner,
        versions,
        failure=counted,
        failure_unmatched=failure_unmatched,
        failure_without_baseline=without,
    )


def expand_metrics(patterns: list[str], available: set[str]) -> tuple[list[str], list[str]]:
    """The metric names matched by ``patterns`` (fnmatch, so ``*`` also spans ``/``), in the patterns' order and
    sorted within one pattern, each once; and the patterns that matched nothing."""
    names: list[str] = []
    unmatched = []
    for pattern in patterns:
        found = sorted(key for key in available if fnmatchcase(key, pattern))
        if not found:
            unmatched.append(pattern)
        names += [key for key in found if key not in names]
    return names, unmatched


def is_per_objective(metric: str) -> bool:
    """One objective's value: ``task/lang/metric``, or a run summary per objective (``F_p_final/xnli/en``)."""
    return metric.count("/") == 2


def family(metric: str) -> str:
    """The per-objective metric's family: ``xnli/en/accuracy`` -> ``xnli/*/accuracy``,
    ``F_p_final/xnli/en`` -> ``F_p_final/*``."""
    first, _, third = metric.split("/")
    return f"{first}/*" if first in RUN_SUMMARIES else f"{first}/*/{third}"


def objective(metric: str) -> str:
    """The objective a per-objective metric is of: ``xnli/en/accuracy`` -> ``en``, ``F_p_final/xnli/en`` ->
    ``xnli/en``."""
    first, second, third = metric.split("/")
    return f"{second}/{third}" if first in RUN_SUMMARIES else second


def _finite_or_none(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _finite_or_none(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_finite_or_none(v) for v in tree]
    return None if isinstance(tree, float) and not math.isfinite(tree) else tree


def _value(metrics: dict[str, Any], key: str) -> Optional[float]:
    value = metrics.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _cell_result(name: str, runs: list[dict[str, Any]], metrics: list[str]) -> CellResult:
    complete = [r for r in runs if r["status"] == "complete"]
    failed = [
        FailedRun(r["run_dir"], r["seed"], r.get("error") or "failed without an error line")
        for r in runs
        if r["status"] == "failed"
    ]
    pending = [r["run_dir"] for r in runs if r["status"] == "pending"]
    axes = dict(runs[0]["axes"]) if runs else {}
    return CellResult(name, axes, len(complete), failed, pending, {m: _stats(complete, m) for m in metrics})


def _stats(runs: list[dict[str, Any]], metric: str) -> MetricStats:
    values = [_value(r["metrics"], metric) for r in runs]
    present = [v for v in values if v is not None]
    finite = np.array([v for v in present if math.isfinite(v)])
    result = MetricStats(n=len(finite), nan=len(present) - len(finite), missing=len(values) - len(present))
    if len(finite):
        result.mean, result.min, result.max = float(finite.mean()), float(finite.min()), float(finite.max())
        result.std = float(finite.std(ddof=1)) if len(finite) > 1 else None
    return result


def _differences(
    cells: list[CellResult],
    runs: dict[str, list[dict[str, Any]]],
    metrics: list[str],
    baseline: Optional[dict[str, Any]],
) -> tuple[list[PairedDifference], list[str]]:
    """Every non-baseline cell against its partner: the same axis values, the baseline's axes set to the baseline."""
    if not baseline:
        return [], []
    differences, no_partner = [], []
    for cell in cells:
        if not cell.axes or all(cell.axes.get(k) == v for k, v in baseline.items()):
            continue  # a baseline cell itself (or a cell without any run record, whose axes are unknown)
        wanted = {**cell.axes, **baseline}
        partner = next((c for c in cells if c.axes == wanted), None)
        if partner is None:
            no_partner.append(cell.name)
            continue
        for metric in metrics:
            differences.append(_paired(cell.name, partner.name, metric, runs[cell.name], runs[partner.name]))
    return differences, no_partner


def _finite_by_seed(runs: list[dict[str, Any]], metric: str) -> dict[int, float]:
    values = {r["seed"]: _value(r["metrics"], metric) for r in runs if r["status"] == "complete"}
    return {seed: v for seed, v in values.items() if v is not None and math.isfinite(v)}


def _paired(
    cell: str, partner: str, metric: str, runs: list[dict[str, Any]], partner_runs: list[dict[str, Any]]
) -> PairedDifference:
    mine, theirs = _finite_by_seed(runs, metric), _finite_by_seed(partner_runs, metric)
    seeds = sorted(set(mine) & set(theirs))
    result = PairedDifference(cell, partner, metric, len(seeds), seeds)
    if not seeds:
        return result
    a, b = np.array([mine[s] for s in seeds]), np.array([theirs[s] for s in seeds])
    diff = a - b
    result.mean = float(diff.mean())
    if len(seeds) < 2:
        return result
    result.std = float(diff.std(ddof=1))
    half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, len(seeds) - 1)) * result.std / math.sqrt(len(seeds))
    result.ci_low, result.ci_high = result.mean - half, result.mean + half
    with warnings.catch_warnings():  # identical differences: scipy warns of precision loss (p is 0, or NaN if all 0)
        warnings.simplefilter("ignore", RuntimeWarning)
        p_value = float(stats.ttest_rel(a, b).pvalue)
    result.p_value = p_value if math.isfinite(p_value) else None
    return result
