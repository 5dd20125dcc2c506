"""The train rows' statistics: averaged over the steps since the last train row of metrics.jsonl."""

from __future__ import annotations

import time
from typing import Any

import torch


class TrainWindow:
    """Sums over the steps since the last log line of a step result's (:class:`mtft.training.step.StepResult`)
    loss, examples, per-objective loss sums and counts, and weights."""

    def __init__(self, num_objectives: int):
        self.start = time.perf_counter()
        self.steps = self.examples = 0
        self.loss = 0.0
        self.sums = torch.zeros(num_objectives, dtype=torch.float64)
        self.counts = torch.zeros(num_objectives, dtype=torch.float64)
        self.weights = torch.zeros(num_objectives, dtype=torch.float64)

    def add(self, result) -> None:
        self.steps += 1
        self.examples += result.examples
        self.loss += result.loss
        self.sums += torch.nan_to_num(result.losses) * result.counts
        self.counts += result.counts
        self.weights += result.weights

    def summary(self, names: list[str]) -> dict[str, Any]:
        values: dict[str, Any] = {
            "loss": self.loss / self.steps,
            "examples_per_s": self.examples / max(time.perf_counter() - self.start, 1e-9),
        }
        means = (self.sums / self.counts).tolist()  # nan for an objective absent from the whole window
        for name, loss, weight in zip(names, means, (self.weights / self.steps).tolist()):
            values[f"loss/{name}"] = loss
            values[f"weight/{name}"] = weight
        return values
