"""MGDA on l2-normalised gradients (Sener & Koltun, NeurIPS 2018)."""

from __future__ import annotations

from typing import Optional

import numpy as np

from mtft.pareto import solve_min_norm
from mtft.weighting.base import Weighting, gradient_norms


class MGDANormalized(Weighting):
    """MGDA on l2-normalised gradients (Sener & Koltun 2018, "Multi-task learning as multi-objective
    optimization", with their ``l2`` gradient normaliser).

    The min-norm problem is solved on the unit vectors u_t = g_t/||g_t|| (Gram G_ts / (||g_t|| ||g_s||)),
    giving v; the direction is Σ_t v_t u_t = Σ_t (v_t/||g_t||) g_t, so the weights are v_t/||g_t||, rescaled to
    sum to 1 (only the direction is defined by the method; the step size is the optimiser's). Note: Sener &
    Koltun's released code applies v_t to the *unnormalised* losses instead; we follow the direction the
    normalised problem defines. Zero-norm objectives get weight 0; if all are zero, the weights are uniform.
    T = 1 goes through the method, so that ``state()`` describes every call.
    """

    name = "mgda_normalized"
    needs_gram = True
    single_objective_shortcut = False

    def weigh(self, losses: np.ndarray, gram: Optional[np.ndarray]) -> np.ndarray:
        assert gram is not None  # needs_gram: the base has checked it
        T = len(gram)
        n, live = gradient_norms(gram)
        if not live.any():
            self._state = {"zero_gradients": float(T)}
            return np.full(T, 1.0 / T)
        nl = n[live]
        v, cert = solve_min_norm(gram[np.ix_(live, live)] / np.outer(nl, nl))
        w = np.zeros(T)
        w[live] = v / nl
        w /= w.sum()
        self._state = {**cert.as_dict(), "zero_gradients": float(T - live.sum())}
        return w
