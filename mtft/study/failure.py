"""The failed-run rate of a study cell: the share of its runs whose metric ends at or below the majority-class
baseline the same run reports (Mosbach, Andriushchenko & Klakow, 2021: a fine-tuning run *fails* when its score is
no better than that of the classifier that always predicts the majority class of the training set).

Every evaluation of a classification task writes the baseline beside the model's metric (``mtft.evaluation.majority``;
a study never imports it, as it never evaluates): ``rte/accuracy`` has ``rte/majority_accuracy``,
``xnli/de/accuracy`` has ``xnli/de/majority_accuracy``. The study file's ``failure`` names the metrics to count
(names or fnmatch patterns); each is paired with its baseline by that rule, run by run, so a baseline that depends
on the run's data (``data.dev_split_seed`` as an axis) is always the run's own. Every metric counted is one where
larger is better (accuracy, F1, MCC, exact match): "at or below" means no better than a constant prediction.

Not to be confused with a run of status *failed* (it crashed; listed with its error line): a failed fine-tuning
run here finished and was scored. Only complete runs with both values finite count (``scored``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any, Iterable, Optional

#: the prefix of the baseline's metric names (mtft.evaluation.majority.MAJORITY; the study may not import it)
MAJORITY = "majority_"
#: "at or below" up to the rounding of a macro average over languages (the same constant scores the same float)
TOLERANCE = 1e-12


@dataclass
class FailureRate:
    """Over a cell's complete runs with a finite ``metric`` and a finite ``baseline``: ``failed`` of ``scored`` runs
    ended at or below the baseline (their seeds in ``failed_seeds``); ``baseline_mean`` is the baseline's mean over
    those runs (the same in every run unless the run's data varies)."""

    metric: str
    baseline: str
    scored: int
    failed: int
    failed_seeds: list[int] = field(default_factory=list)
    baseline_mean: Optional[float] = None

    @property
    def rate(self) -> Optional[float]:
        return self.failed / self.scored if self.scored else None


def baseline_of(metric: str) -> str:
    """The majority-class baseline's name of a task metric: ``rte/accuracy`` -> ``rte/majority_accuracy``."""
    head, _, name = metric.rpartition("/")
    return f"{head}/{MAJORITY}{name}"


def pattern_problem(pattern: str) -> Optional[str]:
    """Why ``pattern`` cannot name a metric with a majority-class baseline (None when it can)."""
    if "/" not in pattern:
        return f"{pattern!r} is not a task metric (<task>/<metric> or <task>/<language>/<metric>)"
    if pattern.rpartition("/")[2].startswith(MAJORITY):
        return f"{pattern!r} names the majority-class baseline itself; name the model's metric ({_unprefixed(pattern)})"
    return None


def expand_failure_metrics(patterns: Iterable[str], available: set[str]) -> tuple[list[str], list[str], list[str]]:
    """The metrics ``patterns`` match among the runs' ``available`` names (never a baseline itself), in the patterns'
    order, sorted within one; the patterns that matched nothing; and the matched metrics no run has a baseline of
    (regression, NER, QA: no majority class) -- those are left out of the first list."""
    names: list[str] = []
    unmatched: list[str] = []
    for pattern in patterns:
        found = sorted(k for k in available if fnmatchcase(k, pattern) and not pattern_problem(k))
        if not found:
            unmatched.append(pattern)
        names += [k for k in found if k not in names]
    without = [m for m in names if baseline_of(m) not in available]
    return [m for m in names if m not in without], unmatched, without


def failure_rate(runs: list[dict[str, Any]], metric: str) -> FailureRate:
    """``metric``'s failed-run count over the complete ``runs`` (records of :func:`mtft.study.aggregate.run_record`)."""
    baseline = baseline_of(metric)
    pairs = [
        (r["seed"], value, reference)
        for r in runs
        if r["status"] == "complete"
        and (value := _finite(r["metrics"].get(metric))) is not None
        and (reference := _finite(r["metrics"].get(baseline))) is not None
    ]
    failed = [seed for seed, value, reference in pairs if value <= reference + TOLERANCE]
    mean = sum(reference for _, _, reference in pairs) / len(pairs) if pairs else None
    return FailureRate(metric, baseline, len(pairs), len(failed), sorted(failed), mean)


def _finite(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _unprefixed(pattern: str) -> str:
    head, _, name = pattern.rpartition("/")
    return f"{head}/{name.removeprefix(MAJORITY)}"
