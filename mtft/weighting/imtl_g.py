"""IMTL-G, impartial multi-task learning's gradient weighting (Liu et al., ICLR 2021), on the Gram."""

from __future__ import annotations

from typing import Optional

import numpy as np

from mtft.weighting.base import Weighting, WeightingOptions, gradient_norms


class IMTLG(Weighting):
    """IMTL-G, the gradient half of "Towards impartial multi-task learning" (Liu et al., ICLR 2021).

    Find g = Σ_t α_t g_t with Σα = 1 whose projections on every unit gradient u_t = g_t/||g_t|| are equal.
    The paper's closed form, with D = [g_1 − g_t]ᵀ and U = [u_1 − u_t]ᵀ (t = 2..T), is
    α_{2:T} = g_1 Uᵀ (D Uᵀ)⁻¹, α_1 = 1 − Σ α_{2:T}. In Gram terms, with M_ts = g_tᵀu_s = G_ts/||g_s||:
    (D Uᵀ)_ij = M_11 − M_1j − M_i1 + M_ij and (g_1 Uᵀ)_j = M_11 − M_1j. When D Uᵀ is singular (duplicate or
    positively collinear gradients make constraints redundant) the minimum-norm least-squares solution is
    used. Zero gradients are left out (weight 0); if all are zero the weights are uniform. T = 1 goes through
    the method, so that ``state()`` describes it.

    The weights can be NEGATIVE for T ≥ 3 when gradients conflict: the method defines α by equal projections,
    not by a simplex. They are returned as the paper defines them; ``state()["min_weight"]`` reports it.
    """

    name = "imtl_g"
    Options = WeightingOptions  # none
    needs_gram = True
    single_objective_shortcut = False

    def weigh(self, losses: np.ndarray, gram: Optional[np.ndarray]) -> np.ndarray:
        assert gram is not None  # needs_gram: the base has checked it
        T = len(gram)
        n, live = gradient_norms(gram)
        if not live.any():
            return np.full(T, 1.0 / T)
        idx = np.flatnonzero(live)
        alpha = np.ones(1)
        if len(idx) > 1:
            m = gram[np.ix_(idx, idx)] / n[idx][None, :]  # M_ts = g_tᵀ u_s
            a = m[0, 0] - m[0, 1:]
            du = m[0, 0] - m[0, 1:][None, :] - m[1:, 0][:, None] + m[1:, 1:]
            rest = np.linalg.lstsq(du.T, a, rcond=1e-12)[0]  # α_{2:T} (DUᵀ) = g_1Uᵀ
            alpha = np.concatenate([[1.0 - rest.sum()], rest])
        w = np.zeros(T)
        w[idx] = alpha
        self._state = {"min_weight": float(w.min()), "zero_gradients": float(T - len(idx))}
        return w
