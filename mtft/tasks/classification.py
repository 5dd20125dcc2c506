"""Sequence classification that can also report the F1 of one named class (GLUE MRPC and QQP: F1 and accuracy).

Binary F1 needs its positive class, and guessing it (the second name? the rarer one?) silently scores the wrong
class; the task names it in its settings (``positive_label: equivalent``), checked against the label names of
the data. Every other metric is the sequence-classification registry's (:data:`mtft.metrics.common.METRICS`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import datasets
from pydantic import BaseModel, ConfigDict, Field

from mtft.core.errors import DataError
from mtft.metrics.common import METRICS, compute, f1
from mtft.tasks.base import Task


class ClassificationSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    positive_label: Optional[str] = Field(
        None, description="The class whose F1 the 'f1' metric reports (GLUE MRPC: equivalent; QQP: duplicate)."
    )


@dataclass
class ClassificationTask(Task):
    Settings = ClassificationSettings

    def available_metrics(self) -> tuple[str, ...]:
        return (*METRICS, "f1")

    def resolve_label_names(self, dataset: datasets.Dataset) -> list[str]:
        names = super().resolve_label_names(dataset)
        positive = self.options.positive_label
        if "f1" in self.metrics and positive not in names:
            raise DataError(
                f"task {self.name!r}: metric f1 needs settings.positive_label, one of the labels "
                f"{', '.join(names)} (got {positive!r})"
            )
        return names

    def compute_metrics(self, predictions: Sequence, references: Sequence) -> dict[str, float]:
        return {
            name: f1(predictions, references, positive=self.options.positive_label)
            if name == "f1"
            else compute(name, predictions, references)
            for name in self.metrics
        }
