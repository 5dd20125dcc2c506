"""The inflection point over pre-training budgets (mtft/study/inflection.py), on hand-made run records."""

from __future__ import annotations

import pytest

from mtft.study.aggregate import run_record
from mtft.study.inflection import curve_inflection, describe, find_inflections

BUDGETS = [1000, 2000, 4000, 8000]
AXIS = "pretrain.tokens"
LR = "training.optimizer.lr"


def records(curves: dict[int, list[float]], lr: float = 1e-3, metric: str = "lp_after") -> list[dict]:
    """One complete run per (seed, budget) with ``metric`` taken from the seed's curve."""
    return [
        run_record(f"tokens-{b}_lr-{lr}", {AXIS: b, LR: lr}, seed, metrics={metric: value})
        for seed, curve in curves.items()
        for b, value in zip(BUDGETS, curve)
    ]


def test_monotone_improving_loss_has_no_inflection():
    (result,) = find_inflections(records({0: [4, 3, 2, 1], 1: [4.1, 3.2, 2.1, 1.1]}), AXIS, "lp_after", True)
    assert result.point is None and result.per_seed == {0: None, 1: None}
    assert result.seeds_none == 2 and result.low is None and result.high is None
    assert "none within the budgets tried" in describe(result)


def test_a_clear_minimum_is_the_inflection_point():
    curves = {0: [3.0, 2.0, 2.5, 3.0], 1: [3.1, 2.1, 2.4, 2.9], 2: [2.9, 1.9, 2.6, 3.2]}
    (result,) = find_inflections(records(curves), AXIS, "lp_after", True)
    assert result.point == 2000 and set(result.per_seed.values()) == {2000}
    assert result.agreement == "all seeds agree" and result.seeds_none == 0
    assert result.mean_curve == pytest.approx([3.0, 2.0, 2.5, 3.0 + (-0.1 + 0.2) / 3])
    assert result.group == {LR: 1e-3} and result.budgets == BUDGETS


def test_seeds_that_disagree_report_their_spread():
    curves = {0: [3.0, 2.0, 2.5, 3.0], 1: [3.0, 2.5, 2.0, 2.6], 2: [3.0, 2.5, 2.0, 1.0]}
    (result,) = find_inflections(records(curves), AXIS, "lp_after", True)
    assert result.per_seed == {0: 2000, 1: 4000, 2: None}
    assert (result.low, result.high, result.seeds_none) == (2000, 4000, 1)
    assert result.agreement == "seeds disagree"
    means = [3.0, 7.0 / 3, 6.5 / 3, 6.6 / 3]
    assert result.mean_curve == pytest.approx(means) and result.point == 4000  # the mean curve's own minimum
    text = describe(result)
    assert "4,000" in text and "0: 2,000" in text and "2: none" in text and "seeds disagree" in text


def test_a_higher_is_better_metric_peaks_at_its_inflection_point():
    curves = {0: [0.5, 0.7, 0.8, 0.6]}
    (result,) = find_inflections(records(curves, metric="xnli/accuracy"), AXIS, "xnli/accuracy", False)
    assert result.point == 4000
    (as_loss,) = find_inflections(records(curves, metric="xnli/accuracy"), AXIS, "xnli/accuracy", True)
    assert as_loss.point == 1000  # read as a loss, the same curve is best at the smallest budget


def test_one_inflection_per_learning_rate():
    data = records({0: [3, 2, 2.5, 3]}, lr=1e-3) + records({0: [3, 2.8, 2.6, 2.5]}, lr=1e-4)
    found = {r.group[LR]: r.point for r in find_inflections(data, AXIS, "lp_after", True)}
    assert found == {1e-3: 2000, 1e-4: None}


def test_tolerance_and_ties():
    assert curve_inflection(BUDGETS, [3, 2, 2.05, 2.01], True, tolerance=0.1) is None
    assert curve_inflection(BUDGETS, [3, 2, 2.05, 2.01], True, tolerance=0.01) == 2000
    assert curve_inflection(BUDGETS, [3, 2, 2, 2.5], True) == 2000  # the smallest budget at the best value
    assert curve_inflection(BUDGETS, [2, 2, 2, 2], True) is None  # flat: nothing got worse
    assert curve_inflection([5], [1.0], True) is None


def test_incomplete_seeds_and_failed_runs_are_not_guessed():
    data = records({0: [3, 2, 2.5, 3], 1: [3, 2, 2.5, 3]})
    data = [r for r in data if not (r["seed"] == 1 and r["axes"][AXIS] == 8000)]  # seed 1 lacks a budget
    data.append(run_record("x", {AXIS: 8000, LR: 1e-3}, 2, status="failed", error="boom"))
    data.append(run_record("y", {AXIS: 4000, LR: 1e-3}, 0, metrics={"lp_after": float("nan")}))
    (result,) = find_inflections(data, AXIS, "lp_after", True)
    assert result.per_seed == {0: 2000} and result.seeds_incomplete == [1]
    assert "seeds [1] lack a budget" in describe(result)


def test_bad_curves_are_refused():
    with pytest.raises(ValueError, match="one value per budget"):
        curve_inflection(BUDGETS, [1.0], True)
    with pytest.raises(ValueError, match="ascending"):
        curve_inflection([2, 1], [1.0, 2.0], True)
    with pytest.raises(ValueError, match="tolerance"):
        curve_inflection(BUDGETS, [1, 2, 3, 4], True, tolerance=-1)
