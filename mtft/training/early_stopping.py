"""Early stopping on ``evaluation.metric_for_best`` (the protocol of Fu, So & Collier, 2023, §4.1: training stops
after N -- there 20 -- consecutive evaluations on the dev set without improvement; the best checkpoint is kept)."""

from __future__ import annotations

from typing import Any, Optional


def is_improvement(value: float, best: Optional[float], greater_is_better: bool) -> bool:
    """Whether ``value`` beats ``best`` strictly (a tie is no improvement; the first value always improves)."""
    if best is None:
        return True
    return value > best if greater_is_better else value < best


class EarlyStopping:
    """The best value of the metric so far and the number of consecutive evaluations that did not improve on it.

    :meth:`update` takes one evaluation's value and says whether it improved; :attr:`should_stop` becomes true
    after exactly ``patience`` consecutive non-improving evaluations (never when ``patience`` is None, which keeps
    best-checkpoint selection alone). The state travels in the training checkpoint, so a resumed run counts on.
    """

    def __init__(self, patience: Optional[int], greater_is_better: bool = True):
        if patience is not None and patience < 1:
            raise ValueError(f"patience must be at least 1, got {patience}")
        self.patience = patience
        self.greater_is_better = greater_is_better
        self.best: Optional[float] = None
        self.evaluations_without_improvement = 0

    def update(self, value: float) -> bool:
        improved = is_improvement(value, self.best, self.greater_is_better)
        if improved:
            self.best = value
            self.evaluations_without_improvement = 0
        else:
            self.evaluations_without_improvement += 1
        return improved

    @property
    def should_stop(self) -> bool:
        return self.patience is not None and self.evaluations_without_improvement >= self.patience

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "evaluations_without_improvement": self.evaluations_without_improvement}

    def load_state_dict(self, state: Optional[dict[str, Any]]) -> None:
        if state:
            self.best = state["best"]
            self.evaluations_without_improvement = int(state["evaluations_without_improvement"])
