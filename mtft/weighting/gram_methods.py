"""Gram-based weightings: each maps the T×T Gram G_ts = g_tᵀg_s of the objectives' shared gradients to
weights w such that the update applied is Σ_t w_t g_t (see :mod:`mtft.weighting.base`).

Every method is written on the Gram alone -- gradients stay where they were computed, and a method that the
literature states with explicit vectors (PCGrad's projections, IMTL-G's difference matrices) is rewritten as
the coefficients of its direction in the basis g_1 … g_T. Conventions shared by all of them:

- T = 1 gives [1.0]: with one objective every method reduces to plain gradient descent.
- Zero gradients never produce NaN (each class documents what it does with them).
- ``state()`` reports the scalars of the last call for the logs.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from mtft.pareto import check_gram, solve_min_norm
from mtft.pareto.cvxpy_backend import psd_factor
from mtft.weighting.base import Weighting, register_weighting

# A gradient whose norm is below this fraction of the largest one is treated as zero (it carries no
# direction that normalisation could recover: only round-off).
_ZERO_NORM = 1e-12


def _prepare(losses: np.ndarray, gram: Optional[np.ndarray]) -> np.ndarray:
    """Validated symmetric float64 Gram whose size matches ``losses``."""
    if gram is None:
        raise ValueError("this weighting needs the Gram of the objectives' gradients (needs_gram = True)")
    g = check_gram(gram)
    if g.shape[0] != len(np.atleast_1d(losses)):
        raise ValueError(f"gram is {g.shape[0]}×{g.shape[0]} but there are {len(losses)} losses")
    return g


def _norms(g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(||g_t||, mask of the non-zero gradients)."""
    n = np.sqrt(np.clip(np.diag(g), 0.0, None))
    return n, n > _ZERO_NORM * n.max() if n.max() > 0 else np.zeros(len(n), bool)


@register_weighting
class LFMLF(Weighting):
    """LF-MLF (less-forgetting multilingual fine-tuning, NeurIPS 2022; SPEC §1): the Pareto min-norm weights.

    w* = argmin_{w ∈ Δ} ||Σ_t w_t g_t||² -- by Theorem 1 the forgetting of pre-training knowledge is bounded by
    the norms of the descent directions, and d = Σ w*_t g_t is the shortest direction that decreases every
    objective (Theorem 2: dᵀg_t ≥ ||d||²). ``state()`` holds the solver's certificate plus ``d_norm_sq``
    (= ||d||²) and ``stationarity`` (= ||d||² / mean_t ||g_t||², the Pareto-stationarity measure of
    Theorem 3). The previous solution warm-starts the next call when T is unchanged.
    """

    name = "lfmlf"
    needs_gram = True

    def __init__(self, solver: str = "exact"):
        if solver not in ("exact", "cvxpy"):
            raise ValueError(f"lfmlf solver must be 'exact' or 'cvxpy', got {solver!r}")
        self.solver = solver
        self._previous: Optional[np.ndarray] = None
        self._state: dict[str, float] = {}

    def __call__(self, losses: np.ndarray, gram: Optional[np.ndarray] = None) -> np.ndarray:
        g = _prepare(losses, gram)
        warm = self._previous if self._previous is not None and len(self._previous) == len(g) else None
        w, cert = solve_min_norm(g, backend=self.solver, warm_start=warm)
        self._previous = w
        mean_sq = float(np.diag(g).mean())
        self._state = {
            **cert.as_dict(),
            "fallback": float(cert.backend == "exact+wolfe"),
            "d_norm_sq": cert.objective,
            "stationarity": cert.objective / mean_sq if mean_sq > 0 else 0.0,
        }
        return w

    def state(self) -> dict[str, float]:
        return dict(self._state)


@register_weighting
class MGDANormalized(Weighting):
    """MGDA on l2-normalised gradients (Sener & Koltun 2018, "Multi-task learning as multi-objective
    optimization", with their ``l2`` gradient normaliser).

    The min-norm problem is solved on the unit vectors u_t = g_t/||g_t|| (Gram G_ts / (||g_t|| ||g_s||)),
    giving v; the direction is Σ_t v_t u_t = Σ_t (v_t/||g_t||) g_t, so the weights are v_t/||g_t||, rescaled to
    sum to 1 (only the direction is defined by the method; the step size is the optimiser's). Note: Sener &
    Koltun's released code applies v_t to the *unnormalised* losses instead; we follow the direction the
    normalised problem defines. Zero-norm objectives get weight 0; if all are zero, the weights are uniform.
    """

    name = "mgda_normalized"
    needs_gram = True

    def __init__(self) -> None:
        self._state: dict[str, float] = {}

    def __call__(self, losses: np.ndarray, gram: Optional[np.ndarray] = None) -> np.ndarray:
        g = _prepare(losses, gram)
        T = len(g)
        n, live = _norms(g)
        if not live.any():
            self._state = {"zero_gradients": float(T)}
            return np.full(T, 1.0 / T)
        nl = n[live]
        v, cert = solve_min_norm(g[np.ix_(live, live)] / np.outer(nl, nl))
        w = np.zeros(T)
        w[live] = v / nl
        w /= w.sum()
        self._state = {**cert.as_dict(), "zero_gradients": float(T - live.sum())}
        return w

    def state(self) -> dict[str, float]:
        return dict(self._state)


@register_weighting
class PCGrad(Weighting):
    """PCGrad, "Gradient surgery for multi-task learning" (Yu et al., NeurIPS 2020), on the Gram.

    For each t (in order 0 … T−1) draw ``perm = rng.permutation(T)`` and, for s in perm with s ≠ t, if the
    projected gradient conflicts with g_s (g_t^PCᵀ g_s < 0), remove its component along g_s:
    g_t^PC ← g_t^PC − (g_t^PCᵀ g_s / ||g_s||²) g_s. Tracking g_t^PC = Σ_s c_s g_s as a coefficient vector c
    makes every dot product a Gram product (g_t^PCᵀ g_s = (Gc)_s). The update is the sum (the paper's
    reduction; ``reduction="mean"`` divides by T as several re-implementations do) of the g_t^PC, so the
    weights are Σ_t c^(t): non-negative, summing to ≥ 1. ``seed`` seeds the numpy Generator whose stream of
    permutations continues across calls. Zero gradients are never projected on (||g_s|| = 0).
    """

    name = "pcgrad"
    needs_gram = True

    def __init__(self, seed: int = 0, reduction: str = "sum"):
        if reduction not in ("sum", "mean"):
            raise ValueError(f"pcgrad reduction must be 'sum' or 'mean', got {reduction!r}")
        self.rng = np.random.default_rng(seed)
        self.reduction = reduction
        self._state: dict[str, float] = {}

    def __call__(self, losses: np.ndarray, gram: Optional[np.ndarray] = None) -> np.ndarray:
        g = _prepare(losses, gram)
        T = len(g)
        if T == 1:
            return np.ones(1)
        diag = np.diag(g)
        total, projections = np.zeros(T), 0
        for t in range(T):
            c = np.zeros(T)
            c[t] = 1.0
            for s in self.rng.permutation(T):
                if s == t or diag[s] <= 0.0:
                    continue
                dot = float(c @ g[:, s])
                if dot < 0.0:
                    c[s] -= dot / diag[s]
                    projections += 1
            total += c
        self._state = {"projections": float(projections), "conflict_fraction": projections / (T * (T - 1))}
        return total / T if self.reduction == "mean" else total

    def state(self) -> dict[str, float]:
        return dict(self._state)


@register_weighting
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
    needs_gram = True

    def __init__(self, c: float = 0.4, rescale: int = 0):
        if c < 0 or rescale not in (0, 1, 2):
            raise ValueError("cagrad needs c ≥ 0 and rescale in {0, 1, 2}")
        self.c = float(c)
        self.rescale = rescale
        self._state: dict[str, float] = {}

    def __call__(self, losses: np.ndarray, gram: Optional[np.ndarray] = None) -> np.ndarray:
        g = _prepare(losses, gram)
        T = len(g)
        if T == 1:
            return np.ones(1)
        scale = float(np.diag(g).max())
        coef = np.full(T, 1.0 / T)
        if scale > 0:
            gs = g / scale
            b = gs.mean(axis=1)  # b_t = g_tᵀ g_0
            sqrt_phi = self.c * np.sqrt(max(float(b.mean()), 0.0))  # ||g_0||² = 1ᵀG1/T²
            w = self.solve_dual(gs, b, sqrt_phi)
            gw_norm = np.sqrt(max(float(w @ gs @ w), 0.0)) if w is not None else 0.0
            if w is not None:
                coef = coef + (sqrt_phi / gw_norm) * w
            self._state = {"gw_norm_sq": float(gw_norm**2 * scale), "g0_norm_sq": float(b.mean()) * scale,
                           "stationary": float(w is None)}
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
            return np.sqrt(max(float(w @ g @ w), 0.0)) - sqrt_phi * tau

        if sqrt_phi <= 0:
            return None
        hi = 2.0 * np.sqrt(float(np.diag(g).max())) / sqrt_phi  # ρ ≤ max_t ||g_t||, so φ(hi) < 0
        lo = 0.0
        if phi(lo) <= 0.0:  # g_w = 0 reachable: look for τ > 0 where ρ(τ) > sqrt_phi·τ
            for k in range(1, 60):
                if phi(hi * 2.0**-k) > 0.0:
                    lo = hi * 2.0**-k
                    break
            else:
                return None
        tau = brentq(phi, lo, hi, xtol=1e-15 * hi, rtol=4 * np.finfo(float).eps, maxiter=200)
        return weights(tau)

    def state(self) -> dict[str, float]:
        return dict(self._state)


@register_weighting
class IMTLG(Weighting):
    """IMTL-G, the gradient half of "Towards impartial multi-task learning" (Liu et al., ICLR 2021).

    Find g = Σ_t α_t g_t with Σα = 1 whose projections on every unit gradient u_t = g_t/||g_t|| are equal.
    The paper's closed form, with D = [g_1 − g_t]ᵀ and U = [u_1 − u_t]ᵀ (t = 2..T), is
    α_{2:T} = g_1 Uᵀ (D Uᵀ)⁻¹, α_1 = 1 − Σ α_{2:T}. In Gram terms, with M_ts = g_tᵀu_s = G_ts/||g_s||:
    (D Uᵀ)_ij = M_11 − M_1j − M_i1 + M_ij and (g_1 Uᵀ)_j = M_11 − M_1j. When D Uᵀ is singular (duplicate or
    positively collinear gradients make constraints redundant) the minimum-norm least-squares solution is
    used. Zero gradients are left out (weight 0); if all are zero the weights are uniform.

    The weights can be NEGATIVE for T ≥ 3 when gradients conflict: the method defines α by equal projections,
    not by a simplex. They are returned as the paper defines them; ``state()["min_weight"]`` reports it.
    """

    name = "imtl_g"
    needs_gram = True

    def __init__(self) -> None:
        self._state: dict[str, float] = {}

    def __call__(self, losses: np.ndarray, gram: Optional[np.ndarray] = None) -> np.ndarray:
        g = _prepare(losses, gram)
        T = len(g)
        n, live = _norms(g)
        if not live.any():
            return np.full(T, 1.0 / T)
        idx = np.flatnonzero(live)
        alpha = np.ones(1)
        if len(idx) > 1:
            m = g[np.ix_(idx, idx)] / n[idx][None, :]  # M_ts = g_tᵀ u_s
            a = m[0, 0] - m[0, 1:]
            du = m[0, 0] - m[0, 1:][None, :] - m[1:, 0][:, None] + m[1:, 1:]
            rest = np.linalg.lstsq(du.T, a, rcond=1e-12)[0]  # α_{2:T} (DUᵀ) = g_1Uᵀ
            alpha = np.concatenate([[1.0 - rest.sum()], rest])
        w = np.zeros(T)
        w[idx] = alpha
        self._state = {"min_weight": float(w.min()), "zero_gradients": float(T - len(idx))}
        return w

    def state(self) -> dict[str, float]:
        return dict(self._state)


@register_weighting
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
    needs_gram = True

    def __init__(self) -> None:
        self._state: dict[str, float] = {}

    def __call__(self, losses: np.ndarray, gram: Optional[np.ndarray] = None) -> np.ndarray:
        g = _prepare(losses, gram)
        T = len(g)
        scale = float(np.diag(g).max())
        if T == 1 or scale <= 0:
            return np.full(T, 1.0 / T)
        v = self.project_rows(g / scale)
        self._state = {"dual_cone_violation": float(max(0.0, -(g @ v.T).min() / scale))}
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

    def state(self) -> dict[str, float]:
        return dict(self._state)
