"""PCGrad, gradient surgery (Yu et al., NeurIPS 2020), written on the Gram."""

from __future__ import annotations

from typing import Literal, Optional

import numpy as np
from pydantic import Field

from mtft.weighting.base import Weighting, WeightingOptions


class PCGradOptions(WeightingOptions):
    seed: int = Field(0, description="Seed of the random order in which each gradient is projected.")
    reduction: Literal["sum", "mean"] = Field(
        "sum", description="The update: the sum of the projected gradients (the paper's) or their mean."
    )


class PCGrad(Weighting):
    """PCGrad, "Gradient surgery for multi-task learning" (Yu et al., NeurIPS 2020), on the Gram.

    For each t (in order 0 … T−1) draw ``perm = rng.permutation(T)`` and, for s in perm with s ≠ t, if the
    projected gradient conflicts with g_s (g_t^PCᵀ g_s < 0), remove its component along g_s:
    g_t^PC ← g_t^PC − (g_t^PCᵀ g_s / ||g_s||²) g_s. Tracking g_t^PC = Σ_s c_s g_s as a coefficient vector c
    makes every dot product a Gram product (g_t^PCᵀ g_s = (Gc)_s). The update is the sum (the paper's
    reduction; ``reduction="mean"`` divides by T as several re-implementations do) of the g_t^PC, so the
    weights are Σ_t c^(t): non-negative, summing to ≥ 1. ``seed`` seeds the numpy Generator whose stream of
    permutations continues across calls (T = 1 draws none). Zero gradients are never projected on
    (||g_s|| = 0).
    """

    name = "pcgrad"
    Options = PCGradOptions
    needs_gram = True

    def __init__(self, seed: int = 0, reduction: str = "sum"):
        super().__init__()
        if reduction not in ("sum", "mean"):
            raise ValueError(f"pcgrad reduction must be 'sum' or 'mean', got {reduction!r}")
        self.rng = np.random.default_rng(seed)
        self.reduction = reduction

    def weigh(self, losses: np.ndarray, gram: Optional[np.ndarray]) -> np.ndarray:
        assert gram is not None  # needs_gram: the base has checked it
        T = len(gram)
        diag = np.diag(gram)
        total, projections = np.zeros(T), 0
        for t in range(T):
            c = np.zeros(T)
            c[t] = 1.0
            for s in self.rng.permutation(T):
                if s == t or diag[s] <= 0.0:
                    continue
                dot = float(c @ gram[:, s])
                if dot < 0.0:
                    c[s] -= dot / diag[s]
                    projections += 1
            total += c
        self._state = {"projections": float(projections), "conflict_fraction": projections / (T * (T - 1))}
        return total / T if self.reduction == "mean" else total
