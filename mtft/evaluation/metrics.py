"""Metrics computed offline (the Hub-hosted ``evaluate`` modules need the network).

Predictions and references are in the task's natural form (label names here).
"""

from __future__ import annotations

from typing import Callable, Sequence

from sklearn.metrics import accuracy_score


def accuracy(predictions: Sequence[str], references: Sequence[str]) -> float:
    return float(accuracy_score(references, predictions))


METRICS: dict[str, Callable[[Sequence[str], Sequence[str]], float]] = {"accuracy": accuracy}


def compute(name: str, predictions: Sequence[str], references: Sequence[str]) -> float:
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    return METRICS[name](predictions, references)
