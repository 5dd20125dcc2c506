"""Reference backend: the min-norm problem through cvxpy with Clarabel (an interior-point conic solver).

Used to validate the exact solver and as a selectable backend. The objective is written as
``sum_squares(R @ w)`` with RᵀR = G, R from a PSD-safe eigendecomposition (eigenvalues clipped at 0): a Gram
is PSD only up to round-off, which ``quad_form``'s PSD check may reject, and ``R @ w`` with ``R`` a
:class:`cvxpy.Parameter` is DPP, so the problem is built and canonicalised once per T and later solves only
update ``R`` (see ``bench/solver.py`` for what that saves).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Optional

import numpy as np

# (problem, R parameter, w variable): cvxpy objects, untyped
CvxpyProblem = tuple[Any, Any, Any]


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


def psd_factor(gram: np.ndarray) -> np.ndarray:
    """R with RᵀR = G (negative round-off eigenvalues clipped to 0)."""
    vals, vecs = np.linalg.eigh(gram)
    return np.sqrt(np.clip(vals, 0.0, None))[:, None] * vecs.T


def project_simplex(v: np.ndarray) -> np.ndarray:
    """Euclidean projection onto {w ≥ 0, Σw = 1} (sort-based, Held et al. 1974)."""
    u = np.sort(v)[::-1]
    css = np.cumsum(u) - 1.0
    k = np.arange(1, len(v) + 1)
    rho = np.flatnonzero(u - css / k > 0)[-1]
    return np.maximum(v - css[rho] / (rho + 1), 0.0)


def solve_cvxpy(gram: np.ndarray, problem: Optional[CvxpyProblem] = None) -> tuple[np.ndarray, int]:
    """(simplex weights, solver iterations) for a validated symmetric Gram; ``problem`` defaults to the cache."""
    import cvxpy as cp

    T = gram.shape[0]
    scale = float(np.diag(gram).max())
    if T == 1 or scale <= 0.0:
        return np.full(T, 1.0 / T), 0
    prob, R, w = problem if problem is not None else cvxpy_problem(T)
    R.value = psd_factor(gram / scale)
    prob.solve(solver=cp.CLARABEL)
    if w.value is None:
        raise RuntimeError(f"cvxpy/Clarabel failed: status {prob.status}")
    iters = prob.solver_stats.num_iters if prob.solver_stats is not None else 0
    return project_simplex(np.asarray(w.value, dtype=np.float64)), int(iters or 0)
