"""The exact Pareto min-norm solver (mtft.pareto) against cvxpy/Clarabel on random and degenerate problems.

The bar: on every problem our weights are a valid simplex vector, our objective is never worse than the
reference's beyond 1e-9 relative (plus 1e-12 of the Gram's scale for problems whose optimum is 0), and the
certificate proves optimality on its own (Frank–Wolfe gap ~ 0, Theorem 2's min_t dᵀg_t − ||d||² ≥ 0).
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mtft.pareto import Certificate, SolverInputError, cvxpy_problem, solve_min_norm
from mtft.pareto.solver import _solve_scaled, _two
from tests.helpers.pareto import (
    FAMILIES,
)

Problem = tuple[str, np.ndarray]  # (family, gradient matrix A with rows g_t); the Gram is A Aᵀ


COUNTS = {"random": 400}  # 400 random + 8 degenerate families × 90 = 1120 problems


def _problems() -> Iterator[Problem]:
    rng = np.random.default_rng(20240611)
    for name, make in FAMILIES.items():
        for _ in range(COUNTS.get(name, 90)):
            yield name, make(rng)


def _assert_simplex(w: np.ndarray, T: int) -> None:
    assert w.dtype == np.float64 and w.shape == (T,)
    assert np.all(w >= 0.0) and abs(w.sum() - 1.0) <= 1e-12


def _assert_certified(cert: Certificate, scale: float) -> None:
    assert cert.fw_gap <= 1e-9 * scale, cert
    assert cert.theorem2 >= -1e-9 * scale, cert
    assert cert.kkt_residual <= 1e-9, cert


def test_against_cvxpy_on_random_and_degenerate_problems():
    seen: dict[str, int] = {}
    for family, a in _problems():
        gram = a @ a.T
        T, scale = len(gram), max(float(np.diag(gram).max()), 1e-300)
        w, cert = solve_min_norm(gram)
        w_ref, ref = solve_min_norm(gram, backend="cvxpy")
        _assert_simplex(w, T)
        _assert_simplex(w_ref, T)
        assert cert.objective <= ref.objective * (1 + 1e-9) + 1e-12 * scale, (family, cert, ref)
        assert np.isclose(cert.objective, float(w @ gram @ w), rtol=1e-12, atol=1e-15 * scale)
        _assert_certified(cert, scale)
        if family == "zero_in_hull":
            assert cert.objective <= 1e-12 * scale, cert
        seen[family] = seen.get(family, 0) + 1
    assert sum(seen.values()) >= 1000 and set(seen) == set(FAMILIES)


@pytest.mark.parametrize("gram", [[[0.0]], [[3.5]], [[1e-300]]])
def test_single_objective_gets_weight_one(gram):
    w, cert = solve_min_norm(np.array(gram))
    assert w.tolist() == [1.0] and cert.fw_gap == 0.0


def test_all_zero_gradients():
    w, cert = solve_min_norm(np.zeros((5, 5)))
    _assert_simplex(w, 5)
    assert cert.objective == 0.0 and cert.theorem2 == 0.0


def test_two_objectives_closed_form_equals_general_path():
    rng = np.random.default_rng(3)
    for k in range(300):
        a = rng.standard_normal((2, int(rng.integers(1, 6))))
        if k % 5 == 0:
            a[1] = rng.uniform(-2, 2) * a[0]  # collinear, of either sign
        if k % 50 == 0:
            a[1] = a[0]  # duplicate: every w is optimal
        gram = a @ a.T
        gn = gram / np.diag(gram).max()
        w2, (w_general, _, _) = _two(gn), _solve_scaled(gn, None)
        w, cert = solve_min_norm(gram)
        assert cert.backend == "closed-form" and np.array_equal(w, w2)
        obj2, obj_general = w2 @ gn @ w2, w_general @ gn @ w_general
        assert abs(obj2 - obj_general) <= 1e-13
        if (a[0] - a[1]) @ (a[0] - a[1]) > 1e-6:  # unique minimiser
            assert np.allclose(w2, w_general, atol=1e-9)


def test_two_objectives_formula():
    g = np.array([[4.0, 1.0], [1.0, 2.0]])  # w1 = (2 - 1) / (4 + 2 - 2) = 0.25
    w, _ = solve_min_norm(g)
    assert np.allclose(w, [0.25, 0.75], atol=1e-15)
    w, _ = solve_min_norm(np.array([[1.0, 1.0], [1.0, 1.0]]))  # identical gradients
    assert w.tolist() == [0.5, 0.5]


def test_t256_is_exact():
    rng = np.random.default_rng(11)
    for n in (300, 100):
        a = rng.standard_normal((256, n))
        gram = a @ a.T
        w, cert = solve_min_norm(gram)
        _assert_simplex(w, 256)
        scale = float(np.diag(gram).max())
        assert cert.fw_gap <= 1e-12 * scale and cert.theorem2 >= -1e-12 * scale, cert
        _, ref = solve_min_norm(gram, backend="cvxpy")
        assert cert.objective <= ref.objective * (1 + 1e-9) + 1e-12 * scale


def test_warm_start_gives_the_same_answer():
    rng = np.random.default_rng(5)
    a = rng.standard_normal((48, 96))
    w0, _ = solve_min_norm(a @ a.T)
    b = a + 1e-3 * rng.standard_normal(a.shape)
    w1, c1 = solve_min_norm(b @ b.T, warm_start=w0)
    w2, c2 = solve_min_norm(b @ b.T)
    assert np.allclose(w1, w2, atol=1e-9) and c1.fw_gap <= 1e-12 * np.diag(b @ b.T).max()
    solve_min_norm(b @ b.T, warm_start=np.zeros(3))  # a useless warm start is ignored


def test_asymmetric_input_is_symmetrised():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((6, 4))
    gram = a @ a.T
    noise = 1e-14 * rng.standard_normal(gram.shape)
    w, _ = solve_min_norm(gram + noise)
    w_ref, _ = solve_min_norm(gram + noise.T)
    assert np.allclose(w, w_ref, atol=1e-9)


@pytest.mark.parametrize(
    "gram, message",
    [
        (np.array([[1.0, np.nan], [np.nan, 1.0]]), "NaN/inf"),
        (np.array([[1.0, 0.0], [0.0, np.inf]]), "NaN/inf"),
        (np.ones((2, 3)), "square"),
        (np.ones(3), "square"),
        (np.ones((2, 2, 2)), "square"),
        (np.zeros((0, 0)), "T = 0"),
        (np.array([[-1.0, 0.0], [0.0, 1.0]]), "positive semi-definite"),
    ],
)
def test_bad_input_is_refused(gram, message):
    with pytest.raises(SolverInputError, match=message):
        solve_min_norm(gram)
    assert issubclass(SolverInputError, ValueError)


def test_unknown_backend():
    with pytest.raises(ValueError, match="backend"):
        solve_min_norm(np.eye(3), backend="nope")


def test_certificate_fields_and_logging():
    a = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    w, cert = solve_min_norm(a @ a.T)
    assert np.allclose(w @ a, [0.5, 0.5])  # d = midpoint of e1, e2
    assert cert.objective == pytest.approx(0.5) and cert.theorem2 == pytest.approx(0.0, abs=1e-15)
    d = cert.as_dict()
    assert set(d) == {
        "objective",
        "fw_gap",
        "kkt_residual",
        "theorem2",
        "min_d_dot_g",
        "floor",
        "iterations",
        "seconds",
    }
    assert d["floor"] == 0.0 and d["min_d_dot_g"] == pytest.approx(0.5)  # min_t dᵀg_t = ||d||² here
    assert all(isinstance(v, float) for v in d.values())
    with pytest.raises(AttributeError):
        cert.objective = 1.0  # frozen


def test_cvxpy_problem_is_built_once_per_t():
    assert cvxpy_problem(7) is cvxpy_problem(7)
    assert cvxpy_problem(7) is not cvxpy_problem(8)


@settings(max_examples=300, deadline=None)
@given(
    hnp.arrays(
        np.float64,
        st.tuples(st.integers(1, 12), st.integers(1, 8)),
        elements=st.one_of(
            st.sampled_from([0.0, 1.0, -1.0]),
            st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False, width=64),
            st.floats(-1e100, 1e100, allow_nan=False, allow_infinity=False, width=64),
        ),
    )
)
def test_property_simplex_and_theorem2(a):
    gram = a @ a.T
    w, cert = solve_min_norm(gram)
    _assert_simplex(w, len(a))
    scale = float(np.diag(gram).max())
    d = w @ a
    # Theorem 2 on the vectors themselves: dᵀg_t ≥ ||d||² for every t (up to round-off).
    assert (a @ d).min() - d @ d >= -1e-9 * max(scale, 1e-300)
    assert cert.theorem2 >= -1e-9 * max(scale, 1e-300)


def test_wolfe_slides_out_of_an_affinely_dependent_corral():
    """Started on three collinear points (a singular KKT matrix), Wolfe's method must slide, not invert."""
    from mtft.pareto import solver

    a = np.array([[2.0, 0.0], [0.0, 2.0], [1.0, 1.0], [0.2, 0.1]])  # g_3 = (g_1 + g_2)/2; d* = g_4
    gram = a @ a.T
    gram /= np.diag(gram).max()
    calls = []
    original = solver._slide

    def spy(*args):
        calls.append(1)
        return original(*args)

    solver._slide = spy
    try:
        w, _ = solver._wolfe(gram, (np.array([0, 1, 2]), np.full(3, 1 / 3)))
    finally:
        solver._slide = original
    assert calls, "the singular corral was not detected"
    assert np.allclose(w @ a, [0.2, 0.1], atol=1e-12) and abs(w.sum() - 1) < 1e-12
