"""LF-MLF: the Pareto min-norm weights of the objectives' gradients (Mao et al., NeurIPS 2022)."""

from __future__ import annotations

from typing import Optional

import numpy as np

from mtft.pareto import solve_min_norm
from mtft.weighting.base import Weighting


class LFMLF(Weighting):
    """LF-MLF ("Less-forgetting multi-lingual fine-tuning", Mao et al., NeurIPS 2022): the Pareto min-norm weights.

    w* = argmin_{w ∈ Δ} ||Σ_t w_t g_t||² -- by Theorem 1 the forgetting of pre-training knowledge is bounded by
    the norms of the descent directions, and d = Σ w*_t g_t is the shortest direction that decreases every
    objective (Theorem 2: dᵀg_t ≥ ||d||²). ``state()`` holds the solver's certificate plus ``d_norm_sq``
    (= ||d||²) and ``stationarity`` (= ||d||² / mean_t ||g_t||², the Pareto-stationarity measure of
    Theorem 3). The previous solution warm-starts the next call when T is unchanged; T = 1 goes through the
    solver too (``single_objective_shortcut = False``), so that the certificate and the warm start describe
    every call.
    """

    name = "lfmlf"
    needs_gram = True
    single_objective_shortcut = False

    def __init__(self, solver: str = "exact"):
        super().__init__()
        if solver not in ("exact", "cvxpy"):
            raise ValueError(f"lfmlf solver must be 'exact' or 'cvxpy', got {solver!r}")
        self.solver = solver
        self._previous: Optional[np.ndarray] = None

    def weigh(self, losses: np.ndarray, gram: Optional[np.ndarray]) -> np.ndarray:
        assert gram is not None  # needs_gram: the base has checked it
        warm = self._previous if self._previous is not None and len(self._previous) == len(gram) else None
        w, cert = solve_min_norm(gram, backend=self.solver, warm_start=warm)
        self._previous = w
        mean_sq = float(np.diag(gram).mean())
        self._state = {
            **cert.as_dict(),
            "fallback": float(cert.backend == "exact+wolfe"),
            "d_norm_sq": cert.objective,
            "stationarity": cert.objective / mean_sq if mean_sq > 0 else 0.0,
        }
        return w
