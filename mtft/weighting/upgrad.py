"""UPGrad, Jacobian descent's projection onto the dual cone (Quinton & Rey, 2024), on the Gram."""

from __future__ import annotations

from typing import Optional

import numpy as np

from mtft.pareto.solver import psd_factor
from mtft.weighting.base import Weighting, WeightingOptions


class UPGrad(Weighting):
    """UPGrad, "Jacobian descent for multi-objective optimization" (Quinton & Rey, 2024; TorchJD's UPGrad).

    Each g_i is projected onto the dual cone {x : g_tᵀx ≥ 0 ∀t} of the gradients, and the projections are
    averaged. The projection is Jᵀv^(i) with v^(i) = argmin_{v ≥ e_i} vᵀGv (its dual); substituting
    v = e_i + z, z ≥ 0, and G = RᵀR, this is the non-negative least-squares problem min_{z≥0} ||Rz + Re_i||²,
    solved exactly by Lawson–Hanson (scipy's ``nnls``). Weights: mean_i v^(i) (≥ 1/T each). Unlike TorchJD we
    add no ridge to G: the factor R comes from an eigendecomposition with round-off eigenvalues clipped at 0.
    ``state()["dual_cone_violation"]`` is max_i,t −(G v^(i))_t / max_t G_tt (≈ 0 by construction).
    """

    name = "upgrad"
    Options = WeightingOptions  # none
    needs_gram = True

    def weigh(self, losses: np.ndarray, gram: Optional[np.ndarray]) -> np.ndarray:
        assert gram is not None  # needs_gram: the base has checked it
        T = len(gram)
        scale = float(np.diag(gram).max())
        if scale <= 0:
            return np.full(T, 1.0 / T)
        v = self.project_rows(gram / scale)
        self._state = {"dual_cone_violation": float(max(0.0, -(gram @ v.T).min() / scale))}
        return v.mean(axis=0)

    @staticmethod
    def project_rows(g: np.ndarray) -> np.ndarray:
        """Row i: v^(i) = argmin_{v ≥ e_i} vᵀGv, so that Jᵀv^(i) is g_i projected onto the dual cone."""
        from scipy.optimize import nnls

        T = len(g)
        r = psd_factor(g)
        v = np.eye(T)
        for i in range(T):
            z, _ = nnls(r, -r[:, i], maxiter=50 * T)
            v[i] += z
        return v
