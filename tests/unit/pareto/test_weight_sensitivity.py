"""How far the min-norm weights move when the Gram moves (issue 38, item 6; docs/lfmlf.md, "Two processes against
one"). On the face of the simplex the weights lie in (free set F), the KKT conditions G_FF w_F = λ1, Σw = 1 give,
to first order, Δw_F = −Z (ZᵀG_FF Z)⁻¹ Zᵀ (ΔG w)_F with Z an orthonormal basis of {x : Σx = 0}: the Gram's
perturbation divided by the smallest eigenvalue of the Gram across the face -- for two objectives ||g_1 − g_2||²/2,
which is small exactly when the gradients nearly coincide, i.e. when the stationarity gauge ||d||²/mean||g_t||² is
near 1. Then float32 round-off in G (~1e-7 relative) moves the weights by 1e-5 and more, while stationarity
reports a benign step."""

from __future__ import annotations

import numpy as np

from mtft.pareto import solve_min_norm


def linearised_change(gram: np.ndarray, w: np.ndarray, delta: np.ndarray, floor: float = 0.0):
    """(first-order Δw, the smallest eigenvalue of G across the face, the bound ||(ΔG w)_F|| / that eigenvalue)."""
    free = np.flatnonzero(w > floor / len(w) + 1e-12)
    n = len(free)
    change = np.zeros(len(w))
    if n < 2:
        return change, np.inf, 0.0
    z = np.linalg.qr(np.vstack([np.eye(n - 1), -np.ones((1, n - 1))]))[0]  # orthonormal, columns sum to 0
    across = z.T @ gram[np.ix_(free, free)] @ z
    pushed = (delta @ w)[free]
    change[free] = -z @ np.linalg.solve(across, z.T @ pushed)
    smallest = float(np.linalg.eigvalsh(across).min())
    return change, smallest, float(np.linalg.norm(pushed) / smallest)


def nearly_parallel(spread: float, size: int = 4096, seed: int = 0) -> np.ndarray:
    """Gradients of two objectives that share most of their direction: g_t = c + spread · e_t."""
    rng = np.random.default_rng(seed)
    common = rng.standard_normal(size)
    return np.stack([common + spread * rng.standard_normal(size), common + spread * rng.standard_normal(size)])


def gram32(gradients: np.ndarray, parts: int) -> np.ndarray:
    """The Gram of float32 gradients as a sharded path forms it: partial Grams of ``parts`` column blocks, each a
    float32 product, summed in float64 (parts=1: the whole product at once)."""
    g = gradients.astype(np.float32)
    return sum(block @ block.T for block in np.array_split(g, parts, axis=1)).astype(np.float64)


def test_the_weights_move_with_the_gram_as_the_linearisation_says():
    gradients = nearly_parallel(0.05)
    gram = gradients @ gradients.T
    w, _ = solve_min_norm(gram)
    rng = np.random.default_rng(1)
    for size in (1e-9, 1e-7):
        delta = rng.standard_normal((2, 2)) * size * np.abs(gram).max()
        delta = (delta + delta.T) / 2
        moved, _ = solve_min_norm(gram + delta)
        change, _, bound = linearised_change(gram, w, delta)
        assert np.abs(moved - w).max() <= bound
        np.testing.assert_allclose(moved - w, change, rtol=1e-3, atol=1e-15)


def test_float32_summation_order_moves_nearly_parallel_objectives_weights_by_1e_5():
    """Nearly coinciding gradients: stationarity ≈ 1 (a benign-looking step), yet the Gram across the face is
    ~1e-2 of its entries, so the two float32 summation orders' Grams (1e-7 apart) give weights ~1e-5 apart -- and
    no more than the linearisation's bound."""
    gradients = nearly_parallel(0.05)
    exact = gradients @ gradients.T
    one, two = gram32(gradients, 1), gram32(gradients, 2)
    w_exact, _ = solve_min_norm(exact)
    w_one, _ = solve_min_norm(one)
    w_two, _ = solve_min_norm(two)
    stationarity = w_exact @ exact @ w_exact / np.mean(np.diag(exact))
    change, smallest, bound = linearised_change(one, w_one, two - one)
    assert stationarity > 0.9 and smallest < 1e-2 * np.abs(exact).max()
    relative = np.abs(two - one).max() / np.abs(one).max()
    assert relative < 1e-6  # float32 round-off of the Gram ...
    assert np.abs(w_two - w_one).max() > 30 * relative  # ... amplified in the weights
    assert np.abs(w_two - w_one).max() <= 1.01 * bound
    np.testing.assert_allclose(w_two - w_one, change, rtol=1e-2, atol=1e-12)
    # well-separated gradients: the same round-off leaves the weights at its own size
    apart = nearly_parallel(1.0)
    one, two = gram32(apart, 1), gram32(apart, 2)
    w_one, _ = solve_min_norm(one)
    w_two, _ = solve_min_norm(two)
    assert np.abs(w_two - w_one).max() <= 10 * np.abs(two - one).max() / np.abs(one).max()
