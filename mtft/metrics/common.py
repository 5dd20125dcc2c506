"""Simple classification/regression metrics, computed offline.

Why by hand: the official ``evaluate`` metric modules (glue, super_glue, seqeval, squad) are downloaded from the
Hugging Face Hub at ``evaluate.load`` time, and the Hub is not reachable here. These functions call the same
scikit-learn / scipy routines those modules wrap, so the numbers agree.

Predictions and references are aligned sequences in the task's natural form: label names for classification,
numbers (or numeric strings) for regression. Every function returns a plain ``float``: in [0, 1] for
accuracy/F1, in [-1, 1] for MCC and correlations.

``METRICS`` holds the metrics with the ``(predictions, references) -> float`` signature, which tasks name in
their ``metrics`` tuple and :func:`compute` dispatches: ``accuracy``, ``macro_f1``, ``mcc``, ``pearson``,
``spearman``. Not registered (they need more than two arguments, call them directly):

* :func:`f1` — binary F1 needs the positive label (GLUE MRPC "equivalent", QQP "duplicate"); pass ``positive``
  or ``label_names`` (then the label at index 1, as GLUE's ClassLabel order puts the positive class there).
* :mod:`mtft.metrics.seqeval_metrics` (WikiANN entity F1), :mod:`mtft.metrics.squad` (TyDiQA EM/F1),
  :mod:`mtft.metrics.superglue` (MultiRC grouped by question, ReCoRD max over gold, CB).
"""

from __future__ import annotations

import math
from typing import Callable, Hashable, Sequence

import numpy as np
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef


def _check(predictions: Sequence, references: Sequence) -> None:
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    if len(references) == 0:
        raise ValueError("no predictions to score")


def accuracy(predictions: Sequence[Hashable], references: Sequence[Hashable]) -> float:
    """Fraction of predictions equal to their reference."""
    _check(predictions, references)
    return float(accuracy_score(list(references), list(predictions)))


def f1(
    predictions: Sequence[Hashable],
    references: Sequence[Hashable],
    positive: Hashable | None = None,
    label_names: Sequence[Hashable] | None = None,
) -> float:
    """Binary F1 of the ``positive`` label (GLUE MRPC/QQP), or of ``label_names[1]`` when only names are given.

    There is deliberately no default: guessing the positive class (e.g. the second name in sorted order) silently
    scores the wrong class. F1 is 0 when the positive class is neither predicted nor present.
    """
    _check(predictions, references)
    if positive is None:
        if label_names is None or len(label_names) != 2:
            raise ValueError("binary f1 needs `positive` or the two `label_names` (positive at index 1)")
        positive = label_names[1]
    # F1 of one class = micro average restricted to that class; unlike average="binary" this also accepts
    # references/predictions holding more than two distinct labels.
    return float(f1_score(list(references), list(predictions), labels=[positive], average="micro", zero_division=0))


def macro_f1(
    predictions: Sequence[Hashable], references: Sequence[Hashable], labels: Sequence[Hashable] | None = None
) -> float:
    """Unweighted mean of per-class F1 (SuperGLUE CB). Classes default to those in references ∪ predictions, as in
    ``sklearn.metrics.f1_score(average="macro")`` used by the official SuperGLUE/``evaluate`` scorers; pass
    ``labels`` to fix the class set (an absent class then counts with F1 0)."""
    _check(predictions, references)
    return float(
        f1_score(
            list(references),
            list(predictions),
            labels=None if labels is None else list(labels),
            average="macro",
            zero_division=0,
        )
    )


def mcc(predictions: Sequence[Hashable], references: Sequence[Hashable]) -> float:
    """Matthews correlation coefficient (GLUE CoLA, SuperGLUE AX-b); 0 when either side is constant."""
    _check(predictions, references)
    return float(matthews_corrcoef(list(references), list(predictions)))


def _numbers(values: Sequence) -> np.ndarray:
    return np.asarray([float(v) for v in values], dtype=np.float64)


def _correlation(value: float) -> float:
    # scipy returns NaN for a constant input; like sklearn's MCC we report 0 (no linear/rank association),
    # which keeps macro averages and checkpoint selection finite.
    return 0.0 if math.isnan(value) else float(value)


def pearson(predictions: Sequence[float | str], references: Sequence[float | str]) -> float:
    """Pearson correlation (GLUE STS-B) of numeric predictions and references (numeric strings accepted)."""
    _check(predictions, references)
    x, y = _numbers(predictions), _numbers(references)
    if len(x) < 2 or np.all(x == x[0]) or np.all(y == y[0]):
        return 0.0
    return _correlation(pearsonr(x, y)[0])


def spearman(predictions: Sequence[float | str], references: Sequence[float | str]) -> float:
    """Spearman rank correlation (GLUE STS-B) of numeric predictions and references (numeric strings accepted)."""
    _check(predictions, references)
    x, y = _numbers(predictions), _numbers(references)
    if len(x) < 2 or np.all(x == x[0]) or np.all(y == y[0]):
        return 0.0
    return _correlation(spearmanr(x, y)[0])


METRICS: dict[str, Callable[[Sequence, Sequence], float]] = {
    "accuracy": accuracy,
    "macro_f1": macro_f1,
    "mcc": mcc,
    "pearson": pearson,
    "spearman": spearman,
}


def compute(name: str, predictions: Sequence, references: Sequence) -> float:
    """Score ``predictions`` against ``references`` with the registered metric ``name``."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    if name not in METRICS:
        raise KeyError(f"unknown metric {name!r}; registered: {sorted(METRICS)}")
    return METRICS[name](predictions, references)
