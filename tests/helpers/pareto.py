"""Families of Gram matrices that stress the min-norm solvers (duplicates, collinear, opposite, zero, rank-deficient,
ill-conditioned, zero in the hull), shared by the solver tests."""

from __future__ import annotations

from typing import Callable

import numpy as np


def _random(rng: np.random.Generator) -> np.ndarray:
    T = int(rng.integers(2, 49))
    n = int(rng.integers(1, 3 * T + 1))
    return rng.standard_normal((T, n)) * np.exp(rng.uniform(-3, 3, size=(T, 1)))


def _duplicates(rng: np.random.Generator) -> np.ndarray:
    base = _random(rng)
    rows = rng.integers(0, len(base), size=len(base) + int(rng.integers(1, 6)))
    return base[rows]


def _collinear(rng: np.random.Generator) -> np.ndarray:
    """Some gradients are c·v with factors of both signs (and the rest random)."""
    a = _random(rng)
    v = rng.standard_normal(a.shape[1])
    k = int(rng.integers(2, len(a) + 1))
    a[:k] = rng.uniform(-2, 2, size=(k, 1)) * v
    return a


def _opposite(rng: np.random.Generator) -> np.ndarray:
    a = _random(rng)
    k = int(rng.integers(1, len(a) // 2 + 1))
    return np.vstack([a, -a[:k]])


def _zeros(rng: np.random.Generator) -> np.ndarray:
    a = _random(rng)
    a[rng.random(len(a)) < 0.3] = 0.0
    return a


def _rank_deficient(rng: np.random.Generator) -> np.ndarray:
    T = int(rng.integers(3, 49))
    r = int(rng.integers(1, T))
    return rng.standard_normal((T, r)) @ rng.standard_normal((r, int(rng.integers(r, 3 * T + 1))))


def _ill_conditioned(rng: np.random.Generator) -> np.ndarray:
    """Singular values spanning 1e-8..1 (G's eigenvalues 1e-16..1)."""
    T = int(rng.integers(3, 49))
    n = int(rng.integers(T, 3 * T + 1))
    u, _ = np.linalg.qr(rng.standard_normal((T, T)))
    v, _ = np.linalg.qr(rng.standard_normal((n, T)))
    return (u * np.logspace(-8, 0, T)) @ v.T


def _zero_in_hull(rng: np.random.Generator) -> np.ndarray:
    """Pareto-stationary: the convex hull contains 0, so the optimum is d = 0."""
    a = _random(rng)
    w = rng.dirichlet(np.ones(len(a)))
    a[-1] -= (w @ a) / w[-1]  # now Σ_t w_t g_t = 0 exactly (up to round-off)
    return a


FAMILIES: dict[str, Callable[[np.random.Generator], np.ndarray]] = {
    "random": _random,
    "duplicates": _duplicates,
    "collinear": _collinear,
    "opposite": _opposite,
    "zeros": _zeros,
    "rank_deficient": _rank_deficient,
    "ill_conditioned": _ill_conditioned,
    "zero_in_hull": _zero_in_hull,
}
