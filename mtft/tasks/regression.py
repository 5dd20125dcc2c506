"""Regression tasks (GLUE STS-B): a number per example, predicted by the ``regression`` head.

Labels are read as floats from a numeric column; there are no label names. Predictions are numbers, scored with
Pearson and Spearman correlation (:mod:`mtft.metrics.common`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import datasets

from mtft.core.errors import DataError
from mtft.tasks.base import Task, unique_by_id
from mtft.tasks.columns import column_values
from mtft.tasks.hidden import HIDDEN_ENCODED, check_not_hidden, hidden_rows

_NUMERIC = ("float16", "float32", "float64", "int8", "int16", "int32", "int64")


@dataclass
class RegressionTask(Task):
    head: str = "regression"
    metrics: Sequence[str] = ("pearson", "spearman")

    def placeholder_label(self, row: Any) -> Any:
        return 0.0

    def available_metrics(self) -> tuple[str, ...]:
        return ("pearson", "spearman")

    def majority_prediction(
        self, train: Sequence[datasets.Dataset], label_names: Sequence[str], where: str
    ) -> Optional[Any]:
        return None  # a number per example: no majority class

    def resolve_label_names(self, dataset: datasets.Dataset) -> list[str]:
        feature = dataset.features.get(self.label_column)
        if not (isinstance(feature, datasets.Value) and feature.dtype in _NUMERIC):
            raise DataError(
                f"task {self.name!r}: column {self.label_column!r} must hold numbers for a regression "
                f"task; its feature is {feature}"
            )
        return []

    def label_ids(self, values: list, label_names: Sequence[str], where: str, rows: Sequence[int]) -> list[float]:
        """The label values as floats; a hidden label (the split's marker, e.g. -1 on GLUE's test sets) is kept
        as :data:`~mtft.tasks.hidden.HIDDEN_ENCODED` (no loss)."""
        out = []
        hidden = hidden_rows(self, values)
        for row, value, is_hidden in zip(rows, values, hidden):
            if is_hidden:
                out.append(HIDDEN_ENCODED)
            elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise DataError(f"{where}: row {row}: label {value!r} is not a finite number")
            else:
                out.append(float(value))
        return out

    def references(self, raw: datasets.Dataset, label_names: Sequence[str], where: str) -> dict[str, Any]:
        values = column_values(raw, self.label_column)
        check_not_hidden(self, values, where)
        return unique_by_id(self.split_ids(raw), self.label_ids(values, label_names, where, range(len(raw))), where)

    def check_prediction(self, prediction: Any, reference: Any, label_names: Sequence[str]) -> Optional[str]:
        if isinstance(prediction, bool) or not isinstance(prediction, (int, float)) or not math.isfinite(prediction):
            return f"prediction {prediction!r} is not a finite number"
        return None
