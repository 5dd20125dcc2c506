"""CAGrad, conflict-averse gradient descent (Liu et al., NeurIPS 2021), its dual solved exactly on the Gram."""

from __future__ import annotations

from typing import Literal, Optional

import numpy as np
from pydantic import Field

from mtft.pareto import solve_min_norm
from mtft.weighting.base import Weighting, WeightingOptions


class CAGradOptions(WeightingOptions):
    c: float = Field(0.4, ge=0.0, description="The radius c of the ball around the mean gradient (0: the mean).")
    rescale: Literal[0, 1, 2] = Field(0, description="The direction d as is (0), d/(1 + c²) (1) or d/(1 + c) (2).")


class CAGrad(Weighting):
    """CAGrad, "Conflict-averse gradient descent for multi-task learning" (Liu et al., NeurIPS 2021).

    With g_0 the average gradient and φ = c²||g_0||², solve the dual over the simplex
        min_w F(w) = g_wᵀg_0 + sqrt(φ) ||g_w||,   g_w = Σ_t w_t g_t,
    (in Gram terms g_wᵀg_0 = wᵀG1/T, ||g_w||² = wᵀGw) and update along d = g_0 + (sqrt(φ)/||g_w||) g_w, the
    maximiser of min_t g_tᵀd over the ball ||d − g_0|| ≤ sqrt(φ). Weights: 1/T + (sqrt(φ)/||g_w||) w_t.
    ``rescale`` follows the authors' code: 0 = d as is (default, the paper's Algorithm 1), 1 = d/(1 + c²),
    2 = d/(1 + c). The small dual is solved exactly (see :meth:`solve_dual`) on G scaled to unit diagonal
    maximum. When F is minimal at g_w = 0 (Pareto-stationary) or g_0 = 0, the direction is g_0 (weights 1/T).
    """

    name = "cagrad"
    Options = CAGradOptions
    needs_gram = True

    def __init__(self, c: float = 0.4, rescale: int = 0):
        super().__init__()
        if c < 0 or rescale not in (0, 1, 2):
            raise ValueError("cagrad needs c ≥ 0 and rescale in {0, 1, 2}")
        self.c = float(c)
        self.rescale = rescale

    def weigh(self, losses: np.ndarray, gram: Optional[np.ndarray]) -> np.ndarray:
        assert gram is not None  # needs_gram: the base has checked it
        T = len(gram)
        scale = float(np.diag(gram).max())
        coef = np.full(T, 1.0 / T)
        if scale > 0:
            gs = gram / scale
            b = gs.mean(axis=1)  # b_t = g_tᵀ g_0
            sqrt_phi = self.c * np.sqrt(max(float(b.mean()), 0.0))  # ||g_0||² = 1ᵀG1/T²
            w = self.solve_dual(gs, b, sqrt_phi)
            gw_norm = np.sqrt(max(float(w @ gs @ w), 0.0)) if w is not None else 0.0
            if w is not None:
                coef = coef + (sqrt_phi / gw_norm) * w
            self._state = {
                "gw_norm_sq": float(gw_norm**2 * scale),
                "g0_norm_sq": float(b.mean()) * scale,
                "stationary": float(w is None),
            }
        coef /= (1.0, 1.0 + self.c**2, 1.0 + self.c)[self.rescale]
        return coef

    @staticmethod
    def solve_dual(g: np.ndarray, b: np.ndarray, sqrt_phi: float) -> Optional[np.ndarray]:
        """argmin_{w ∈ Δ} F(w) = wᵀb + sqrt_phi·||g_w|| (b = G1/T), exactly, via min-norm problems.

        For τ > 0 let w(τ) be the min-norm weights of the shifted points g_t + τ g_0 (Gram
        G + τ(b1ᵀ + 1bᵀ) + τ²||g_0||², solved exactly by :func:`solve_min_norm`) and e = g_w + τ g_0 its
        min-norm point. Its optimality condition, g_tᵀe minimal and constant on the support, is F's KKT
        condition (∂F/∂w_t = g_tᵀ(g_0 + sqrt_phi·g_w/||g_w||)) exactly when sqrt_phi/||g_w|| = 1/τ, i.e. at a
        root of ρ(τ) − sqrt_phi·τ with ρ(τ) = ||g_{w(τ)}|| (continuous, as the min-norm point is unique).
        Brent's method finds it in ~10–20 exact solves. This replaces the authors' SLSQP, which is slow at
        T ≈ 50 and accurate only to its tolerance. Returns None when sqrt_phi = 0 or F's minimum is at
        g_w = 0 (then d = g_0).
        """
        from scipy.optimize import brentq

        q = max(float(b.mean()), 0.0)  # ||g_0||²
        warm: list[Optional[np.ndarray]] = [None]

        def weights(tau: float) -> np.ndarray:
            shifted = g + tau * (b[:, None] + b[None, :]) + tau * tau * q
            w, _ = solve_min_norm(shifted, warm_start=warm[0])
            warm[0] = w
            return w

        def phi(tau: float) -> float:
            w = weights(tau)
            return float(np.sqrt(max(float(w @ g @ w), 0.0)) - sqrt_phi * tau)

        if sqrt_phi <= 0:
            return None
        hi = 2.0 * np.sqrt(float(np.diag(g).max())) / sqrt_phi  # ρ ≤ max_t ||g_t||, so φ(hi) < 0
        # A min-norm point at 0 comes back with ||g_w|| at round-off (~1e-7 of the largest ||g_t||), not 0: below
        # this it is 0, or Brent's method would bracket a root made of round-off and return ||g_w|| = 0 weights.
        zero = 1e-6 * np.sqrt(float(np.diag(g).max()))
        lo = 0.0
        if phi(lo) <= zero:  # g_w = 0 reachable: look for τ > 0 where ρ(τ) > sqrt_phi·τ
            for k in range(1, 60):
                if phi(hi * 2.0**-k) > zero:
                    lo = hi * 2.0**-k
                    break
            else:
                return None
        tau = brentq(phi, lo, hi, xtol=1e-15 * hi, rtol=4 * np.finfo(float).eps, maxiter=200)
        return weights(tau)
