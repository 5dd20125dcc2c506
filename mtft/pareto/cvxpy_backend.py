"""Reference backend: the min-norm problem through cvxpy with Clarabel (an interior-point conic solver).

Used to validate the exact solver and as a selectable backend. The objective is written as
``sum_squares(R @ w)`` with RᵀR = G, R from a PSD-safe eigendecomposition (eigenvalues clipped at 0): a Gram
is PSD only up to round-off, which ``quad_form``'s PSD check may reject, and ``R @ w`` with ``R`` a
:class:`cvxpy.Parameter` is DPP, so the problem is built and canonicalised once per T and later solves only
update ``R`` (see ``bench/solver.py`` for what that saves). The floored variant (w_t ≥ β/T) is the same problem
with the lower bound a Parameter, written directly in w: an independent check of the exact solver's reduction
to the points (1 − β)g_t + βḡ.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Optional

import numpy as np

from mtft.pareto.solver import psd_factor

# (problem, R parameter, w variable): cvxpy objects, untyped
CvxpyProblem = tuple[Any, Any, Any]
# (problem, R parameter, w variable, lower-bound parameter)
CvxpyFlooredProblem = tuple[Any, Any, Any, Any]


@lru_cache(maxsize=None)
def cvxpy_problem(T: int) -> CvxpyProblem:
    """(problem, R parameter, w variable) for T objectives, built once and cached."""
    return _build(T)


def _build(T: int) -> CvxpyProblem:
    """A fresh (uncached) problem; ``cvxpy_problem`` caches this."""
    import cvxpy as cp

    R = cp.Parameter((T, T), name="R")
    w = cp.Variable(T, name="w")
    problem = cp.Problem(cp.Minimize(cp.sum_squares(R @ w)), [w >= 0, cp.sum(w) == 1])
    return problem, R, w


@lru_cache(maxsize=None)
def cvxpy_floored_problem(T: int) -> CvxpyFlooredProblem:
    """(problem, R, w, lo) for min ||Rw||² s.t. Σw = 1, w ≥ lo (lo = β/T, a scalar Parameter); built once per T."""
    import cvxpy as cp

    R = cp.Parameter((T, T), name="R")
    lo = cp.Parameter(nonneg=True, name="lo")
    w = cp.Variable(T, name="w")
    problem = cp.Problem(cp.Minimize(cp.sum_squares(R @ w)), [w >= lo, cp.sum(w) == 1])
    return problem, R, w, lo


def project_simplex(v: np.ndarray) -> np.ndarray:
    """Euclidean projection onto {w ≥ 0, Σw = 1} (sort-based, Held et al. 1974)."""
    u = np.sort(v)[::-1]
    css = np.cumsum(u) - 1.0
    k = np.arange(1, len(v) + 1)
    rho = np.flatnonzero(u - css / k > 0)[-1]
    return np.maximum(v - css[rho] / (rho + 1), 0.0)


def solve_cvxpy(gram: np.ndarray, problem: Optional[CvxpyProblem] = None, floor: float = 0.0) -> tuple[np.ndarray, int]:
    """(weights, solver iterations) for a validated symmetric Gram; ``problem`` defaults to the cache.

    ``floor`` = β > 0 solves over the floored simplex {Σw = 1, w_t ≥ β/T} (``problem`` is then ignored); the
    solver's point is projected onto that set, so the weights are feasible exactly.
    """
    import cvxpy as cp

    T = gram.shape[0]
    scale = float(np.diag(gram).max())
    if T == 1 or scale <= 0.0 or floor >= 1.0:
        return np.full(T, 1.0 / T), 0
    lo = None
    if floor > 0.0:
        prob, R, w, lo = cvxpy_floored_problem(T)
        lo.value = floor / T
    else:
        prob, R, w = problem if problem is not None else cvxpy_problem(T)
    R.value = psd_factor(gram / scale)
    prob.solve(solver=cp.CLARABEL)
    if w.value is None:
        raise RuntimeError(f"cvxpy/Clarabel failed: status {prob.status}")
    iters = prob.solver_stats.num_iters if prob.solver_stats is not None else 0
    raw = np.asarray(w.value, dtype=np.float64)
    if lo is None:
        return project_simplex(raw), int(iters or 0)
    base = floor / T
    return base + (1.0 - floor) * project_simplex((raw - base) / (1.0 - floor)), int(iters or 0)
