"""Multi-objective mixing and sampling."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtft.data.sampler import MultiObjectiveSampler, mixing_probabilities

sizes_strategy = st.lists(st.integers(1, 10_000), min_size=1, max_size=12)


def test_mixing_formulas():
    sizes = [100, 400, 1600]
    np.testing.assert_allclose(mixing_probabilities(sizes, "proportional"), [100 / 2100, 400 / 2100, 1600 / 2100])
    np.testing.assert_allclose(mixing_probabilities(sizes, "uniform"), [1 / 3] * 3)
    # T = 2: p ∝ sqrt(n) = 10, 20, 40
    np.testing.assert_allclose(mixing_probabilities(sizes, "temperature", 2.0), [10 / 70, 20 / 70, 40 / 70])
    # cap 400: counts 100, 400, 400
    np.testing.assert_allclose(mixing_probabilities(sizes, "proportional", cap=400), [1 / 9, 4 / 9, 4 / 9])


@given(sizes_strategy, st.floats(1.0, 50.0))
def test_temperature_ratios_are_size_ratios_to_the_power_one_over_t(sizes, temperature):
    p = mixing_probabilities(sizes, "temperature", temperature)
    n = np.asarray(sizes, dtype=float)
    assert p.sum() == pytest.approx(1.0) and (p > 0).all()
    np.testing.assert_allclose(p[:, None] / p[None, :], (n[:, None] / n[None, :]) ** (1 / temperature), rtol=1e-9)
    # hence: the order of the objectives is kept, and the largest/smallest ratio flattens as T grows
    assert (np.argsort(p, kind="stable") == np.argsort(n, kind="stable")).all()
    assert p.max() / p.min() <= n.max() / n.min() + 1e-9


def test_refuses_empty_objectives():
    with pytest.raises(ValueError, match="at least one example"):
        mixing_probabilities([3, 0], "uniform")


def test_batches_mix_objectives_in_proportion():
    sampler = MultiObjectiveSampler([50, 50, 50], [0.2, 0.3, 0.5], batch_size=64, seed=0)
    counts = Counter(t for _ in range(300) for t, _ in sampler.next_batch())
    total = sum(counts.values())
    for t, p in enumerate([0.2, 0.3, 0.5]):
        assert abs(counts[t] / total - p) < 0.02
    assert len({t for t, _ in sampler.next_batch()}) > 1  # a batch holds several objectives


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 30), min_size=1, max_size=5), st.integers(1, 16), st.integers(0, 2**31))
def test_every_row_visited_once_per_pass(sizes, batch, seed):
    probabilities = np.full(len(sizes), 1.0 / len(sizes))
    sampler = MultiObjectiveSampler(sizes, probabilities, batch, seed)
    drawn = {t: [] for t in range(len(sizes))}
    for _ in range(20):
        for t, row in sampler.next_batch():
            drawn[t].append(row)
    for t, rows in drawn.items():
        full_passes = len(rows) // sizes[t]
        for k in range(full_passes):
            assert sorted(rows[k * sizes[t] : (k + 1) * sizes[t]]) == list(range(sizes[t]))


def test_deterministic_and_resumable():
    def make():
        return MultiObjectiveSampler([7, 13, 5], [0.5, 0.3, 0.2], batch_size=6, seed=42)

    straight = make()
    expected = [straight.next_batch() for _ in range(30)]
    first = make()
    head = [first.next_batch() for _ in range(11)]
    resumed = make()
    resumed.load_state_dict(first.state_dict())
    tail = [resumed.next_batch() for _ in range(19)]
    assert head + tail == expected
    other_seed = MultiObjectiveSampler([7, 13, 5], [0.5, 0.3, 0.2], batch_size=6, seed=43)
    assert [other_seed.next_batch() for _ in range(30)] != expected


def test_state_for_other_objectives_refused():
    sampler = MultiObjectiveSampler([3, 3], [0.5, 0.5], 2, 0)
    with pytest.raises(ValueError, match="different set of objectives"):
        sampler.load_state_dict({"batches_drawn": 0, "cursor": [0], "passes": [0]})
