"""Gram-based weightings (one module each under mtft.weighting): each against the problem that defines it,
checked with explicit gradient vectors (rows of A, Gram A Aᵀ) -- the methods themselves only ever see the Gram.
The properties shared by every registered weighting are in test_weighting_properties.py."""

from __future__ import annotations

import re

import cvxpy as cp
import numpy as np
import pytest

from mtft.pareto import SolverInputError, solve_min_norm
from mtft.weighting import LFMLF, WEIGHTINGS, CAGrad, MGDANormalized, PCGrad, UPGrad, build_weighting

GRAM_METHODS = ["lfmlf", "mgda_normalized", "pcgrad", "cagrad", "imtl_g", "upgrad"]


def _gradients(seed: int, T: int = 6, n: int = 10) -> np.ndarray:
    """Gaussian rows of varied norms: about half of the pairs conflict (negative dot product)."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((T, n)) * np.exp(rng.uniform(-1, 1, size=(T, 1)))


CASES = [(seed, T, n) for seed, (T, n) in enumerate([(3, 5), (5, 3), (6, 10), (8, 20), (12, 4), (15, 40)])]


def test_the_gram_methods_ask_for_the_gram():
    assert all(WEIGHTINGS[name].needs_gram for name in GRAM_METHODS) and not WEIGHTINGS["mean"].needs_gram


@pytest.mark.parametrize("seed, T, n", CASES)
def test_lfmlf_is_the_min_norm_point_and_satisfies_theorem2(seed, T, n):
    a = _gradients(seed, T, n)
    gram = a @ a.T
    m = build_weighting("lfmlf")
    w = m(np.ones(T), gram)
    _, ref = solve_min_norm(gram, backend="cvxpy")
    d = w @ a
    scale = np.diag(gram).max()
    assert abs(w.sum() - 1) < 1e-12 and (w >= 0).all()
    assert d @ d <= ref.objective * (1 + 1e-9) + 1e-12 * scale
    assert (a @ d).min() >= d @ d - 1e-9 * scale  # Theorem 2: dᵀg_t ≥ ||d||² for every t
    s = m.state()
    assert s["d_norm_sq"] == pytest.approx(d @ d, rel=1e-9, abs=1e-15)
    assert s["stationarity"] == pytest.approx(d @ d / np.diag(gram).mean(), rel=1e-9, abs=1e-15)
    assert {"objective", "fw_gap", "kkt_residual", "theorem2", "iterations", "seconds"} <= set(s)
    w2 = m(np.ones(T), gram)  # warm-started from w: same answer
    assert np.allclose(w2 @ a, d, atol=1e-9 * np.sqrt(scale))


def test_lfmlf_cvxpy_solver_option():
    a = _gradients(3, 6, 10)
    w_exact = build_weighting("lfmlf")(np.ones(6), a @ a.T)
    w_cvx = WEIGHTINGS["lfmlf"](solver="cvxpy")(np.ones(6), a @ a.T)
    assert np.allclose(w_exact @ a, w_cvx @ a, atol=1e-6)
    with pytest.raises(ValueError):
        WEIGHTINGS["lfmlf"](solver="nope")


def test_lfmlf_pareto_stationary():
    a = np.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0]])  # g_1 + g_2 = 0
    m = build_weighting("lfmlf")
    w = m(np.ones(3), a @ a.T)
    assert np.allclose(w @ a, 0, atol=1e-12) and m.state()["stationarity"] < 1e-20


@pytest.mark.parametrize("seed, T, n", CASES)
@pytest.mark.parametrize("floor", [0.1, 0.5])
def test_lfmlf_floor_solves_the_floored_problem(seed, T, n, floor):
    a = _gradients(seed, T, n)
    gram = a @ a.T
    m = build_weighting("lfmlf", {"floor": floor})
    w = m(np.ones(T), gram)
    w_ref = LFMLF(solver="cvxpy", floor=floor)(np.ones(T), gram)
    assert w.min() >= floor / T and abs(w.sum() - 1) < 1e-12
    d, d_ref = w @ a, w_ref @ a
    assert d @ d <= d_ref @ d_ref * (1 + 1e-9) + 1e-12 * np.diag(gram).max()
    s = m.state()
    assert s["floor"] == floor and s["min_d_dot_g"] == pytest.approx((a @ d).min(), rel=1e-9, abs=1e-15)
    assert s["d_norm_sq"] == pytest.approx(d @ d, rel=1e-9) and s["fw_gap"] <= 1e-12 * np.diag(gram).max()


def test_lfmlf_floor_keeps_the_other_objectives_learning():
    """A fitted objective (tiny gradient) takes all the weight without the floor, at most 1 − (T−1)β/T with it."""
    a = np.array([[1e-3, 0.0, 0.0], [1.0, 0.2, 0.0], [0.8, 0.0, 0.5]])
    w = build_weighting("lfmlf")(np.ones(3), a @ a.T)
    assert w[0] > 0.99
    m = build_weighting("lfmlf", {"floor": 0.3})
    w = m(np.ones(3), a @ a.T)
    assert w[1:].min() >= 0.3 / 3 and w[0] <= 0.8 + 1e-12
    assert (a @ (w @ a))[1:].min() > 0.1  # the others now decrease markedly along −d


@pytest.mark.parametrize("floor", [-0.1, 1.01, float("nan"), "0.1", None])
def test_lfmlf_floor_is_validated(floor):
    with pytest.raises(ValueError, match="floor must be"):
        build_weighting("lfmlf", {"floor": floor})


def _normalised(a: np.ndarray, losses: np.ndarray, normalize: str) -> np.ndarray:
    """Sener & Koltun (2018)'s normalisers on explicit vectors: g_t / c_t."""
    norms = np.linalg.norm(a, axis=1)
    c = {"none": np.ones(len(a)), "l2": norms, "loss": losses, "loss+": losses * norms}[normalize]
    return a / c[:, None]


@pytest.mark.parametrize("normalize", ["none", "l2", "loss", "loss+"])
@pytest.mark.parametrize("seed, T, n", CASES[:4])
def test_lfmlf_normalize_is_the_min_norm_direction_of_the_normalised_gradients(seed, T, n, normalize):
    a = _gradients(seed, T, n)
    losses = np.random.default_rng(seed).uniform(0.05, 3.0, T)
    u = _normalised(a, losses, normalize)
    v_exact, _ = solve_min_norm(u @ u.T)  # the exact solver on the explicitly normalised vectors
    _, ref = solve_min_norm(u @ u.T, backend="cvxpy")
    m = build_weighting("lfmlf", {"normalize": normalize})
    w = m(losses, a @ a.T)
    assert (w >= 0).all() and abs(w.sum() - 1) < 1e-12
    d = w @ a  # = Σ v_t u_t up to a positive factor
    du = (v_exact @ u) * (d @ (v_exact @ u)) / ((v_exact @ u) @ (v_exact @ u))
    assert np.allclose(d, du, atol=1e-9 * np.linalg.norm(d))
    s = m.state()
    assert s["objective"] <= ref.objective * (1 + 1e-9) + 1e-12 * np.diag(u @ u.T).max()  # normalised units
    assert s["d_norm_sq"] == pytest.approx(d @ d, rel=1e-9) and s["min_d_dot_g"] == pytest.approx((a @ d).min())


def test_normalisation_breaks_the_mean_gradient_bound_that_the_floor_keeps():
    """g_1 = (0, 1) short; l2 puts the weight on the long g_2, g_3: ||d|| = 4 > ||ḡ|| = 3."""
    a = np.array([[0.0, 1.0], [-4.0, 4.0], [4.0, 4.0]])
    mean_norm = np.linalg.norm(a.mean(axis=0))
    w = build_weighting("lfmlf", {"normalize": "l2"})(np.ones(3), a @ a.T)
    assert np.allclose(w, [0.0, 0.5, 0.5]) and np.linalg.norm(w @ a) == pytest.approx(4.0) and mean_norm == 3.0
    for floor in (0.0, 0.3, 0.9):
        w = build_weighting("lfmlf", {"floor": floor})(np.ones(3), a @ a.T)
        assert np.linalg.norm(w @ a) <= mean_norm + 1e-12


def test_mgda_normalized_is_lfmlf_with_l2():
    a = _gradients(6, 8, 12)
    assert issubclass(MGDANormalized, LFMLF) and MGDANormalized().normalize == "l2"
    w = build_weighting("mgda_normalized")(np.ones(8), a @ a.T)
    assert w.tobytes() == build_weighting("lfmlf", {"normalize": "l2"})(np.ones(8), a @ a.T).tobytes()


def test_lfmlf_loss_normalisers_leave_out_zero_losses_and_refuse_negative_ones():
    a = _gradients(7, 4, 6)
    m = build_weighting("lfmlf", {"normalize": "loss+"})
    w = m(np.array([0.5, 0.0, 1.0, 2.0]), a @ a.T)
    assert w[1] == 0.0 and abs(w.sum() - 1) < 1e-12 and m.state()["left_out"] == 1.0
    for normalize in ("loss", "loss+"):
        for bad in (-0.2, np.nan):
            with pytest.raises(
                SolverInputError, match=re.escape(f"normalize='{normalize}'") + ".*objective 2 has loss"
            ):
                build_weighting("lfmlf", {"normalize": normalize})(np.array([0.5, 1.0, bad, 2.0]), a @ a.T)
    # l2 does not look at the losses
    assert np.isfinite(build_weighting("lfmlf", {"normalize": "l2"})(np.array([0.5, 1.0, -1.0, 2.0]), a @ a.T)).all()
    with pytest.raises(ValueError, match="normalize must be one of none, l2, loss, loss\\+"):
        build_weighting("lfmlf", {"normalize": "l1"})


def test_lfmlf_normalize_with_floor_floors_the_normalised_weights():
    a = _gradients(8, 5, 9)
    m = build_weighting("lfmlf", {"normalize": "l2", "floor": 0.5})
    w = m(np.ones(5), a @ a.T)
    v = w * np.linalg.norm(a, axis=1)
    v /= v.sum()  # back to the weights of the unit gradients
    assert v.min() >= 0.1 - 1e-12 and m.state()["floor"] == 0.5


@pytest.mark.parametrize("seed, T, n", CASES)
def test_mgda_normalized_is_min_norm_of_unit_gradients(seed, T, n):
    a = _gradients(seed, T, n)
    norms = np.linalg.norm(a, axis=1)
    u = a / norms[:, None]
    w = build_weighting("mgda_normalized")(np.ones(T), a @ a.T)
    assert abs(w.sum() - 1) < 1e-12
    v = w * norms / (w * norms).sum()  # the simplex weights on the unit vectors: Σ w_t g_t ∝ Σ v_t u_t
    assert np.allclose((w @ a) * (w * norms).sum() ** -1, v @ u, atol=1e-12)
    _, ref = solve_min_norm(u @ u.T, backend="cvxpy")
    du = v @ u
    assert du @ du <= ref.objective * (1 + 1e-9) + 1e-12
    assert (u @ du).min() >= du @ du - 1e-9


def test_mgda_normalized_zero_gradient_gets_zero_weight():
    a = _gradients(2, 4, 6)
    a[2] = 0.0
    w = build_weighting("mgda_normalized")(np.ones(4), a @ a.T)
    assert w[2] == 0.0 and abs(w.sum() - 1) < 1e-12


def _pcgrad_vectors(a: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """PCGrad on explicit vectors (Yu et al. 2020, Algorithm 1), same permutation protocol as PCGrad."""
    T = len(a)
    out = np.zeros(a.shape[1])
    for t in range(T):
        g = a[t].copy()
        for s in rng.permutation(T):
            if s == t or a[s] @ a[s] == 0:
                continue
            if g @ a[s] < 0:
                g -= (g @ a[s]) / (a[s] @ a[s]) * a[s]
        out += g
    return out


@pytest.mark.parametrize("seed, T, n", CASES)
def test_pcgrad_matches_the_vector_implementation(seed, T, n):
    a = _gradients(seed, T, n)
    m = PCGrad(seed=seed)
    rng = np.random.default_rng(seed)
    for _ in range(3):  # the permutation stream continues across calls
        w = m(np.ones(T), a @ a.T)
        assert np.allclose(w @ a, _pcgrad_vectors(a, rng), atol=1e-10 * np.abs(a).max())
        assert w.sum() >= 1 - 1e-12
    assert np.allclose(
        PCGrad(seed=seed, reduction="mean")(np.ones(T), a @ a.T) * T, PCGrad(seed=seed)(np.ones(T), a @ a.T)
    )


def test_pcgrad_no_conflict_is_sum():
    a = np.abs(_gradients(4, 5, 7))  # all pairwise dots positive: nothing is projected
    assert np.allclose(PCGrad()(np.ones(5), a @ a.T), 1.0)


def _cagrad_primal(a: np.ndarray, c: float) -> np.ndarray:
    """CAGrad's primal on explicit vectors: max_d min_t g_tᵀd s.t. ||d − g_0|| ≤ c||g_0||."""
    g0 = a.mean(axis=0)
    d = cp.Variable(a.shape[1])
    problem = cp.Problem(cp.Maximize(cp.min(a @ d)), [cp.norm(d - g0) <= c * np.linalg.norm(g0)])
    problem.solve(solver=cp.CLARABEL)
    return d.value


@pytest.mark.parametrize("seed, T, n", CASES)
@pytest.mark.parametrize("c", [0.4, 0.9])
def test_cagrad_solves_its_primal(seed, T, n, c):
    a = _gradients(seed, T, n)
    gram = a @ a.T
    w = CAGrad(c=c)(np.ones(T), gram)
    d, d_ref = w @ a, _cagrad_primal(a, c)
    g0 = a.mean(axis=0)
    radius = c * np.linalg.norm(g0)
    assert np.linalg.norm(d - g0) <= radius * (1 + 1e-9)  # feasible
    # as good as the reference (whose d is accurate only to ~sqrt of Clarabel's tolerance)
    assert (a @ d).min() >= (a @ d_ref).min() - 1e-7 * np.linalg.norm(g0) ** 2
    assert np.allclose(d, d_ref, atol=1e-3 * np.linalg.norm(g0))
    # rescale divides by the documented factors
    assert np.allclose(CAGrad(c=c, rescale=1)(np.ones(T), gram), w / (1 + c**2), rtol=1e-6)
    assert np.allclose(CAGrad(c=c, rescale=2)(np.ones(T), gram), w / (1 + c), rtol=1e-6)


@pytest.mark.parametrize("seed, T, n", CASES + [(9, 48, 100), (10, 48, 20)])
def test_cagrad_dual_optimality_condition(seed, T, n):
    a = _gradients(seed, T, n)
    g = a @ a.T
    g /= np.diag(g).max()
    b = g.mean(axis=1)
    sqrt_phi = 0.4 * np.sqrt(b.mean())
    w = CAGrad.solve_dual(g, b, sqrt_phi)
    grad = b + sqrt_phi * (g @ w) / np.sqrt(w @ g @ w)
    support = w > 0
    # KKT on the simplex (F is convex): the gradient is minimal and constant on the support
    assert np.ptp(grad[support]) <= 1e-12 and grad.min() >= grad[support].max() - 1e-12


@pytest.mark.parametrize("seed, T, n", CASES)
def test_imtl_g_equal_projections(seed, T, n):
    a = _gradients(seed, T, n)
    w = build_weighting("imtl_g")(np.ones(T), a @ a.T)
    u = a / np.linalg.norm(a, axis=1, keepdims=True)
    proj = u @ (w @ a)
    assert abs(w.sum() - 1) < 1e-9
    if n >= T - 1:  # T − 1 independent equations: solvable exactly when the g's span enough dimensions
        assert np.ptp(proj) <= 1e-8 * np.abs(proj).max()


def test_imtl_g_two_objectives_closed_form():
    a = np.array([[3.0, 0.0], [0.0, 1.0]])
    w = build_weighting("imtl_g")(np.ones(2), a @ a.T)
    assert np.allclose(w, [0.25, 0.75])  # α_t ∝ 1/||g_t||: the bisector of the unit vectors
    w = build_weighting("imtl_g")(np.ones(3), np.vstack([a, a[:1]]) @ np.vstack([a, a[:1]]).T)
    d = w @ np.vstack([a, a[:1]])
    assert np.isclose(d @ a[0] / 3.0, d @ a[1])  # a duplicate objective changes nothing


def _project_dual_cone(a: np.ndarray, x: np.ndarray) -> np.ndarray:
    p = cp.Variable(a.shape[1])
    cp.Problem(cp.Minimize(cp.sum_squares(p - x)), [a @ p >= 0]).solve(solver=cp.CLARABEL)
    return p.value


@pytest.mark.parametrize("seed, T, n", CASES)
def test_upgrad_projects_each_row_onto_the_dual_cone(seed, T, n):
    a = _gradients(seed, T, n)
    gram = a @ a.T
    scale = np.diag(gram).max()
    v = UPGrad.project_rows(gram / scale)
    w = build_weighting("upgrad")(np.ones(T), gram)
    assert np.allclose(w, v.mean(axis=0))
    for i in range(T):
        p = v[i] @ a
        assert (a @ p).min() >= -1e-9 * scale  # in the dual cone
        assert (v[i] >= np.eye(T)[i] - 1e-12).all()
        ref = _project_dual_cone(a, a[i])
        # the closest such point: no worse than the reference projection
        assert np.linalg.norm(p - a[i]) <= np.linalg.norm(ref - a[i]) + 1e-6 * np.sqrt(scale)
        assert np.allclose(p, ref, atol=1e-5 * np.sqrt(scale))


def test_cagrad_pareto_stationary_and_zero_mean():
    a = np.array([[1.0, 0.0], [-1.0, 0.0]])  # g_0 = 0: d = g_0 = 0, weights 1/T
    assert np.allclose(CAGrad()(np.ones(2), a @ a.T), [0.5, 0.5])
    # 0 in the hull, g_0 = (0, 1/3): F(w) = w_3/3 + sqrt(φ)||g_w|| ≥ 0 = F at g_w = 0, so d = g_0
    a = np.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0]])
    m = CAGrad()
    assert np.allclose(m(np.ones(3), a @ a.T), 1 / 3) and m.state()["stationary"] == 1.0
    # 0 in the hull but F < 0 reachable: a genuine g_w ≠ 0, still feasible for the primal
    a = np.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [-0.5, -0.2]])
    w = CAGrad(c=0.2)(np.ones(4), a @ a.T)
    d, g0 = w @ a, a.mean(axis=0)
    assert np.isfinite(w).all() and (w >= 0).all()
    assert np.linalg.norm(d - g0) <= 0.2 * np.linalg.norm(g0) * (1 + 1e-9)
    assert (a @ d).min() >= (a @ _cagrad_primal(a, 0.2)).min() - 1e-7
