"""The floored min-norm problem (the LF-MLF collapse guard): min wᵀGw over Δ_β = {Σw = 1, w_t ≥ β/T}.

The exact solver reduces it to the min-norm problem of the points (1 − β)g_t + βḡ; the reference here is
cvxpy/Clarabel with the floor written as a constraint on w itself, so the reduction is checked, not assumed.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mtft.pareto import Certificate, cvxpy_floored_problem, floored_vertex_gram, solve_min_norm
from tests.helpers.pareto import FAMILIES

FLOORS = (0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99)


def _scaled(rng: np.random.Generator, a: np.ndarray) -> np.ndarray:
    """Most problems at unit scale; one in five with gradients 1e-100..1e100 long (Grams 1e-200..1e200)."""
    return a * 10.0 ** rng.uniform(-100, 100) if rng.random() < 0.2 else a


def _problems() -> Iterator[tuple[str, np.ndarray, float]]:
    """1,000 (family, gradients, β): 310 random, 90 of each degenerate family, 60 with T = 1."""
    rng = np.random.default_rng(20240612)
    for name, make in FAMILIES.items():
        for _ in range(310 if name == "random" else 90):
            yield name, _scaled(rng, make(rng)), float(rng.choice(FLOORS))
    for _ in range(60):
        yield "single", _scaled(rng, rng.standard_normal((1, int(rng.integers(1, 4))))), float(rng.choice(FLOORS))


def _assert_floored(w: np.ndarray, T: int, beta: float) -> None:
    """On Δ_β: every weight ≥ β/T exactly, the sum 1 up to round-off."""
    assert w.dtype == np.float64 and w.shape == (T,)
    assert w.min() >= beta / T and abs(w.sum() - 1.0) <= 1e-12, (w.min(), beta / T, w.sum())


def _assert_certified(cert: Certificate, scale: float) -> None:
    assert cert.fw_gap <= 1e-9 * scale and cert.kkt_residual <= 1e-9, cert


def _mean_norm_sq(gram: np.ndarray) -> float:
    """||ḡ||² = 1ᵀG1/T², the objective at the uniform weights (feasible for every β)."""
    return float(gram.sum()) / len(gram) ** 2


def test_floored_against_cvxpy_on_random_and_degenerate_problems():
    seen: dict[str, int] = {}
    for family, a, beta in _problems():
        gram = a @ a.T
        T, scale = len(gram), max(float(np.diag(gram).max()), 1e-300)
        w, cert = solve_min_norm(gram, floor=beta)
        w_ref, ref = solve_min_norm(gram, floor=beta, backend="cvxpy")
        _assert_floored(w, T, beta)
        _assert_floored(w_ref, T, beta)
        assert cert.objective <= ref.objective * (1 + 1e-9) + 1e-12 * scale, (family, beta, cert, ref)
        # ...and no better than the reference allows: ½(f(w_ref) − f*) ≤ its own Frank–Wolfe gap
        assert ref.objective - cert.objective <= min(2 * ref.fw_gap + 1e-12 * scale, 1e-7 * scale), (family, cert, ref)
        assert np.isclose(cert.objective, float(w @ gram @ w), rtol=1e-12, atol=1e-15 * scale)
        assert cert.objective <= _mean_norm_sq(gram) * (1 + 1e-12) + 1e-15 * scale  # uniform is feasible
        assert cert.floor == beta and cert.min_d_dot_g == pytest.approx((gram @ w).min(), rel=1e-12, abs=1e-15 * scale)
        _assert_certified(cert, scale)
        seen[family] = seen.get(family, 0) + 1
    assert sum(seen.values()) >= 1000 and set(seen) == {*FAMILIES, "single"}


def test_floor_zero_is_the_unfloored_solver():
    rng = np.random.default_rng(7)
    for name, make in FAMILIES.items():
        for _ in range(5):
            gram = (a := make(rng)) @ a.T
            w, cert = solve_min_norm(gram)
            for zero in (0.0, 0, np.float64(0.0)):
                w0, cert0 = solve_min_norm(gram, floor=zero)
                assert w0.tobytes() == w.tobytes(), name
                assert (cert0.objective, cert0.fw_gap, cert0.theorem2) == (cert.objective, cert.fw_gap, cert.theorem2)
            # and the floored path is continuous at 0: a tiny floor changes the optimum by round-off only
            _, tiny = solve_min_norm(gram, floor=1e-12)
            assert tiny.objective == pytest.approx(cert.objective, rel=1e-9, abs=1e-11 * np.diag(gram).max())


@pytest.mark.parametrize("T", [1, 2, 5, 48])
def test_floor_one_is_the_mean(T):
    a = np.random.default_rng(T).standard_normal((T, 7))
    w, cert = solve_min_norm(a @ a.T, floor=1.0)
    assert w.tolist() == [1.0 / T] * T
    assert (
        cert.objective == pytest.approx(_mean_norm_sq(a @ a.T), rel=1e-12)
        and cert.fw_gap <= 1e-15 * np.diag(a @ a.T).max()
    )


def test_norm_is_non_decreasing_in_the_floor_and_at_most_the_mean_gradient():
    """Δ_β shrinks as β grows (nested feasible sets), down to the uniform weights at β = 1."""
    rng = np.random.default_rng(11)
    betas = [0.0, 0.001, 0.05, 0.1, 0.2, 0.35, 0.5, 0.65, 0.8, 0.9, 0.99, 1.0]
    for name, make in FAMILIES.items():
        for _ in range(6):
            gram = (a := make(rng)) @ a.T
            scale = max(float(np.diag(gram).max()), 1e-300)
            objectives = [solve_min_norm(gram, floor=b)[1].objective for b in betas]
            assert all(hi >= lo - 1e-12 * scale for lo, hi in zip(objectives, objectives[1:])), (name, objectives)
            assert objectives[-1] == pytest.approx(_mean_norm_sq(gram), rel=1e-9, abs=1e-15 * scale)
            assert max(objectives) <= _mean_norm_sq(gram) + 1e-12 * scale


def test_two_objectives_match_the_clamped_closed_form():
    """T = 2: w_1 is the unconstrained minimiser clamped to [β/2, 1 − β/2]."""
    rng = np.random.default_rng(3)
    for k in range(200):
        a = rng.standard_normal((2, int(rng.integers(1, 5))))
        if k % 4 == 0:
            a[1] = rng.uniform(-2, 2) * a[0]
        gram, beta = a @ a.T, float(rng.choice(FLOORS))
        den = gram[0, 0] + gram[1, 1] - 2 * gram[0, 1]
        w1 = np.clip((gram[1, 1] - gram[0, 1]) / den, beta / 2, 1 - beta / 2)
        w, _ = solve_min_norm(gram, floor=beta)
        assert w[0] == pytest.approx(w1, abs=1e-9) and w[1] == pytest.approx(1 - w1, abs=1e-9)


def test_the_guarantee_of_theorem2_is_lost_and_reported():
    """A fitted objective (tiny g_1) opposed by another: the floored direction increases L_1 to first order."""
    a = np.array([[0.01, 0.0], [-1.0, 1.0]])
    gram = a @ a.T
    w0, exact = solve_min_norm(gram)
    assert exact.theorem2 >= -1e-15 and w0[0] > 0.99  # collapse: nearly all the weight on the fitted g_1
    w, cert = solve_min_norm(gram, floor=0.9)
    d = w @ a
    assert cert.min_d_dot_g == pytest.approx((a @ d).min()) and cert.min_d_dot_g < 0 and cert.theorem2 < 0
    assert cert.fw_gap <= 1e-15 and w.min() >= 0.45  # still the exact optimum on Δ_0.9


def test_vertex_gram_is_the_gram_of_the_shifted_points():
    rng = np.random.default_rng(5)
    a = rng.standard_normal((6, 4))
    for beta in FLOORS:
        p = (1 - beta) * a + beta * a.mean(axis=0)
        assert np.allclose(floored_vertex_gram(a @ a.T, beta), p @ p.T, rtol=1e-12, atol=1e-14)


def test_warm_start_gives_the_same_answer():
    rng = np.random.default_rng(9)
    a = rng.standard_normal((48, 96))
    w0, _ = solve_min_norm(a @ a.T, floor=0.3)
    b = a + 1e-3 * rng.standard_normal(a.shape)
    w1, c1 = solve_min_norm(b @ b.T, floor=0.3, warm_start=w0)
    w2, _ = solve_min_norm(b @ b.T, floor=0.3)
    assert np.allclose(w1, w2, atol=1e-9) and c1.fw_gap <= 1e-12 * np.diag(b @ b.T).max()


@pytest.mark.parametrize(
    "floor, message",
    [
        (-0.1, r"in \[0, 1\].*got -0.1"),
        (1.5, "got 1.5"),
        (np.nan, "got nan"),
        (np.inf, "got inf"),
        ("0.1", "a number"),
        (True, "a number"),
        (None, "a number"),
    ],
)
def test_bad_floor_is_refused(floor, message):
    with pytest.raises(ValueError, match=message):
        solve_min_norm(np.eye(3), floor=floor)


def test_cvxpy_floored_problem_is_built_once_per_t():
    assert cvxpy_floored_problem(7) is cvxpy_floored_problem(7)
    assert cvxpy_floored_problem(7) is not cvxpy_floored_problem(8)


@settings(max_examples=120, deadline=None)
@given(
    hnp.arrays(
        np.float64,
        st.tuples(st.integers(1, 10), st.integers(1, 6)),
        elements=st.one_of(
            st.sampled_from([0.0, 1.0, -1.0]),
            st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False, width=64),
        ),
    ),
    st.floats(0.0, 1.0),
    st.integers(0, 2**32 - 1),
)
def test_property_feasible_certified_and_no_worse_than_any_feasible_point(a, beta, seed):
    gram = a @ a.T
    T, scale = len(a), max(float(np.diag(gram).max()), 1e-300)
    w, cert = solve_min_norm(gram, floor=beta)
    _assert_floored(w, T, beta)
    _assert_certified(cert, scale)
    d = w @ a
    others = beta / T + (1 - beta) * np.random.default_rng(seed).dirichlet(np.ones(T), size=20)
    assert d @ d <= (np.linalg.norm(others @ a, axis=1) ** 2).min() + 1e-9 * scale
