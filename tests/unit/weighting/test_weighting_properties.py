"""Properties of every registered weighting, parametrised over ``WEIGHTINGS`` (as TorchJD tests every aggregator
against the properties it claims; Quinton & Rey 2024). A method added to the registry is held to the common
ones without new code; a property that defines only some methods names them below, so a new method joins or
is exempted explicitly. A few option settings that change what a method computes (LF-MLF's floor and gradient
normalisations) are held to the same properties as methods of their own (``VARIANTS``). Method-specific checks
(each method against the problem it solves) are in test_weightings.py. Gradients are explicit rows of A (Gram
A Aᵀ); the methods only ever see the Gram (and the losses, which vary here so that loss normalisers matter).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

from mtft.pareto import SolverInputError
from mtft.weighting import WEIGHTINGS, Weighting, build_weighting

# Option settings tested like methods: id -> (method, options).
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "lfmlf[floor=0.3]": ("lfmlf", {"floor": 0.3}),
    "lfmlf[normalize=loss]": ("lfmlf", {"normalize": "loss"}),
    "lfmlf[normalize=loss+]": ("lfmlf", {"normalize": "loss+"}),
}
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {**{name: (name, {}) for name in WEIGHTINGS}, **VARIANTS}
ALL = sorted(CONFIGS)
GRAM = [key for key in ALL if WEIGHTINGS[CONFIGS[key][0]].needs_gram]
LOSS_ONLY = [key for key in ALL if not WEIGHTINGS[CONFIGS[key][0]].needs_gram]


def _build(key: str) -> Weighting:
    method, options = CONFIGS[key]
    return build_weighting(method, options)


def _identity(a: np.ndarray, losses: np.ndarray) -> np.ndarray:
    return a


def _unit(a: np.ndarray, losses: np.ndarray) -> np.ndarray:
    return a / np.linalg.norm(a, axis=1, keepdims=True)


def _per_loss(a: np.ndarray, losses: np.ndarray) -> np.ndarray:
    return a / losses[:, None]


def _unit_per_loss(a: np.ndarray, losses: np.ndarray) -> np.ndarray:
    return _unit(a, losses) / losses[:, None]


# Min-norm methods: the weights are (a rescaling of) the min-norm point of these rows' convex hull
# (Mao et al. 2022, Problem 2; Sener & Koltun 2018 on normalised gradients).
MIN_NORM: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "lfmlf": _identity,
    "mgda_normalized": _unit,
    "lfmlf[normalize=loss]": _per_loss,
    "lfmlf[normalize=loss+]": _unit_per_loss,
}
SIMPLEX = {"mean", "lfmlf[floor=0.3]", *MIN_NORM}  # w ≥ 0 and Σw = 1
# Σ_t w_t g_t conflicts with no objective (g_tᵀd ≥ 0): TorchJD's "non-conflicting" property.
NON_CONFLICTING = {*MIN_NORM, "upgrad"}
# Weights that may be negative, by the method's definition.
SIGNED = {"imtl_g": "equal projections on the unit gradients, not a simplex (Liu et al. 2021)"}
# Methods whose weights depend on the objectives' order.
ORDER_DEPENDENT = {"pcgrad": "projections in a random order drawn per call (Yu et al. 2020)"}


def _gradients(seed: int, T: int, n: int) -> np.ndarray:
    """Gaussian rows of varied norms: about half of the pairs conflict (negative dot product)."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((T, n)) * np.exp(rng.uniform(-1, 1, size=(T, 1)))


# (seed, T, n): more and fewer gradients than dimensions; INDEPENDENT ones have n ≥ T (unique weights).
CASES = [(seed, T, n) for seed, (T, n) in enumerate([(2, 3), (3, 5), (5, 3), (6, 10), (8, 20), (12, 4), (15, 40)])]
INDEPENDENT = [case for case in CASES if case[2] >= case[1]]


def _losses(T: int) -> np.ndarray:
    """Distinct positive losses (a loss normaliser divides by them)."""
    return 0.5 + np.arange(T) / T


def _weigh(key: str, a: np.ndarray, losses: np.ndarray | None = None) -> tuple[np.ndarray, Weighting]:
    m = _build(key)
    return m(_losses(len(a)) if losses is None else losses, a @ a.T), m


def _scale(a: np.ndarray) -> float:
    return float((a * a).sum(axis=1).max())


@pytest.mark.parametrize("name", sorted(WEIGHTINGS))
def test_registered_under_its_name(name):
    cls = WEIGHTINGS[name]
    assert issubclass(cls, Weighting) and cls.name == name
    m = build_weighting(name)  # every option has a default
    assert type(m) is cls and m.state() == {}


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("seed, T, n", CASES)
def test_shape_dtype_finite_and_state(name, seed, T, n):
    w, m = _weigh(name, _gradients(seed, T, n))
    assert w.dtype == np.float64 and w.shape == (T,) and np.isfinite(w).all()
    state = m.state()
    assert all(isinstance(k, str) and isinstance(v, float) and np.isfinite(v) for k, v in state.items())
    state["injected"] = 1.0  # state() is a copy
    assert "injected" not in m.state()


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("gram", [[[2.5]], [[0.0]], [[1e-300]]])
def test_single_objective_gets_weight_one(name, gram):
    w = _build(name)(np.array([0.7]), np.array(gram))
    assert w.dtype == np.float64 and w.tolist() == [1.0]


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("zeros", [[1], [0, 3], [0, 1, 2, 3]])
def test_zero_gradients_give_finite_weights(name, zeros):
    a = _gradients(1, T=4, n=6)
    a[zeros] = 0.0
    w, m = _weigh(name, a)
    assert w.shape == (4,) and np.isfinite(w).all()
    assert all(np.isfinite(v) for v in m.state().values())
    if name not in SIGNED:
        assert (w >= 0).all()


@pytest.mark.parametrize("name", ALL)
def test_zero_gradient_with_zero_in_the_hull_gives_finite_weights(name):
    a = np.array([[0.0, 0.0], [-0.2, 1.1], [0.1, 0.4], [0.0, -0.9]])
    w, m = _weigh(name, a)
    assert np.isfinite(w).all() and all(np.isfinite(v) for v in m.state().values())


@pytest.mark.parametrize("name", ALL)
def test_inputs_are_not_modified(name):
    a = _gradients(2, 6, 8)
    losses, gram = np.linspace(0.5, 2.0, 6), a @ a.T
    kept = losses.copy(), gram.copy()
    _build(name)(losses, gram)
    assert np.array_equal(losses, kept[0]) and np.array_equal(gram, kept[1])


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("losses", [np.ones((2, 2)), np.ones(0), np.float64(1.0)])
def test_losses_must_be_a_non_empty_vector(name, losses):
    with pytest.raises(ValueError):
        _build(name)(losses, np.eye(max(losses.size, 1)))


@pytest.mark.parametrize("name", ALL)
def test_fresh_instances_are_reproducible(name):
    """Data-parallel ranks each hold their own instance and must agree bit for bit."""
    a = _gradients(3, 8, 12)
    assert _weigh(name, a)[0].tobytes() == _weigh(name, a)[0].tobytes()


@pytest.mark.parametrize("name", GRAM)
def test_gram_is_required(name):
    with pytest.raises(ValueError, match="needs_gram"):
        _build(name)(np.ones(3), None)


BAD_GRAMS = {
    "NaN": (np.array([[1.0, np.nan], [np.nan, 1.0]]), SolverInputError, "NaN/inf"),
    "inf": (np.array([[np.inf, 0.0], [0.0, 1.0]]), SolverInputError, "NaN/inf"),
    "asymmetric": (np.array([[1.0, 0.5], [-0.5, 1.0]]), SolverInputError, r"not symmetric: G\[0,1\] = 0.5"),
    "negative diagonal": (np.array([[1.0, 0.0], [0.0, -1.0]]), SolverInputError, "not positive semi-definite"),
    "not square": (np.ones((2, 3)), SolverInputError, "square"),
    "wrong size": (np.eye(3), ValueError, "gram is 3×3 but there are 2 losses"),
}


@pytest.mark.parametrize("name", GRAM)
@pytest.mark.parametrize("bad", sorted(BAD_GRAMS))
def test_unusable_gram_is_refused_in_one_line(name, bad):
    gram, error, message = BAD_GRAMS[bad]
    with pytest.raises(error, match=message) as info:
        _build(name)(np.ones(2), gram)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", GRAM)
def test_round_off_asymmetry_is_averaged_away(name):
    a = _gradients(4, 5, 9)
    gram = a @ a.T
    noisy = gram + 1e-9 * _scale(a) * np.triu(np.random.default_rng(0).standard_normal((5, 5)), 1)
    averaged = 0.5 * noisy + 0.5 * noisy.T
    assert _build(name)(_losses(5), noisy).tobytes() == _build(name)(_losses(5), averaged).tobytes()


@pytest.mark.parametrize("name", LOSS_ONLY)
def test_loss_only_weighting_ignores_the_gram(name):
    m = _build(name)
    assert np.array_equal(m(np.ones(3)), m(np.ones(3), np.full((2, 2), np.nan)))


@pytest.mark.parametrize("name", sorted(set(ALL) - set(SIGNED)))
@pytest.mark.parametrize("seed, T, n", CASES)
def test_weights_non_negative(name, seed, T, n):
    w, _ = _weigh(name, _gradients(seed, T, n))
    assert (w >= 0).all() and w.sum() > 0


@pytest.mark.parametrize("name", sorted(SIMPLEX))
@pytest.mark.parametrize("seed, T, n", CASES)
def test_on_the_simplex(name, seed, T, n):
    w, _ = _weigh(name, _gradients(seed, T, n))
    assert (w >= 0).all() and abs(w.sum() - 1.0) < 1e-12


@pytest.mark.parametrize("name", sorted(MIN_NORM))
@pytest.mark.parametrize("seed, T, n", CASES)
def test_min_norm_point_satisfies_theorem2(name, seed, T, n):
    """Mao et al. 2022, Theorem 2: the min-norm d = Σ_t v_t u_t has u_tᵀd ≥ ||d||² for every t."""
    a = _gradients(seed, T, n)
    u = MIN_NORM[name](a, _losses(T))
    w, _ = _weigh(name, a)
    # Σ_t w_t g_t = c Σ_t v_t u_t with v on the simplex: v_t ∝ w_t ||g_t|| / ||u_t||
    v = w * np.linalg.norm(a, axis=1) / np.linalg.norm(u, axis=1)
    v /= v.sum()
    d = v @ u
    assert (u @ d).min() >= d @ d - 1e-9 * _scale(u)


@pytest.mark.parametrize("name", sorted(NON_CONFLICTING))
@pytest.mark.parametrize("seed, T, n", CASES)
def test_direction_conflicts_with_no_objective(name, seed, T, n):
    a = _gradients(seed, T, n)
    w, _ = _weigh(name, a)
    assert (a @ (w @ a)).min() >= -1e-9 * _scale(a) * np.abs(w).sum()


@pytest.mark.parametrize("name", sorted(set(ALL) - set(ORDER_DEPENDENT)))
@pytest.mark.parametrize("seed, T, n", INDEPENDENT)
def test_permutation_equivariant(name, seed, T, n):
    """Relabelling the objectives relabels the weights (unique weights: independent gradients)."""
    a = _gradients(seed, T, n)
    perm = np.random.default_rng(seed).permutation(T)
    w, _ = _weigh(name, a)
    w_perm, _ = _weigh(name, a[perm], _losses(T)[perm])
    assert np.allclose(w_perm, w[perm], rtol=1e-8, atol=1e-10 * np.abs(w).max())


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("factor", [1e-8, 1e6])
@pytest.mark.parametrize("seed, T, n", CASES[:4])
def test_invariant_to_the_gradients_scale(name, factor, seed, T, n):
    """Only the direction is the method's; the step size is the optimiser's (no absolute thresholds)."""
    a = _gradients(seed, T, n)
    w, _ = _weigh(name, a)
    w_scaled, _ = _weigh(name, a * np.sqrt(factor))
    assert np.allclose(w_scaled, w, rtol=1e-8, atol=1e-10 * np.abs(w).max())
