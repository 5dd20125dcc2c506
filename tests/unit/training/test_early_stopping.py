"""Early stopping's counter (mtft.training.early_stopping) and its config check (evaluation.early_stopping_patience)."""

from __future__ import annotations

import pydantic
import pytest

from mtft.config.schema import EvaluationSection
from mtft.training.early_stopping import EarlyStopping, is_improvement


def _stop_points(stopper: EarlyStopping, values: list[float]) -> list[bool]:
    points = []
    for value in values:
        stopper.update(value)
        points.append(stopper.should_stop)
    return points


@pytest.mark.parametrize("patience", [1, 2, 3])
def test_stops_after_exactly_patience_non_improving_evaluations(patience):
    stopper = EarlyStopping(patience, greater_is_better=True)
    values = [0.5] + [0.4] * (patience + 2)  # the first evaluation improves, every later one is worse
    assert _stop_points(stopper, values) == [False] * patience + [True] * 3
    assert stopper.best == 0.5 and stopper.evaluations_without_improvement == patience + 2


def test_an_improvement_resets_the_count():
    stopper = EarlyStopping(2, greater_is_better=True)
    assert _stop_points(stopper, [0.5, 0.4, 0.6, 0.55, 0.58, 0.3]) == [False, False, False, False, True, True]
    assert stopper.best == 0.6


def test_lower_is_better():
    stopper = EarlyStopping(2, greater_is_better=False)
    assert [stopper.update(v) for v in [1.0, 0.8, 0.9, 0.7, 0.75, 0.71]] == [True, True, False, True, False, False]
    assert stopper.should_stop and stopper.best == 0.7


@pytest.mark.parametrize("greater_is_better", [True, False])
def test_a_tie_is_no_improvement(greater_is_better):
    stopper = EarlyStopping(2, greater_is_better=greater_is_better)
    assert [stopper.update(0.5) for _ in range(3)] == [True, False, False]
    assert stopper.should_stop
    assert not is_improvement(0.5, 0.5, greater_is_better) and is_improvement(0.5, None, greater_is_better)


def test_no_patience_never_stops_but_still_tracks_the_best():
    stopper = EarlyStopping(None)
    assert _stop_points(stopper, [0.5] + [0.1] * 50) == [False] * 51
    assert stopper.best == 0.5


def test_the_state_survives_a_round_trip():
    stopper = EarlyStopping(3, greater_is_better=True)
    for value in [0.5, 0.4, 0.3]:
        stopper.update(value)
    resumed = EarlyStopping(3, greater_is_better=True)
    resumed.load_state_dict(stopper.state_dict())
    assert not resumed.should_stop and not resumed.update(0.45) and resumed.should_stop
    fresh = EarlyStopping(3)
    fresh.load_state_dict(None)  # a checkpoint without the state: nothing counted yet
    assert fresh.best is None and fresh.evaluations_without_improvement == 0


def test_patience_below_one_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        EarlyStopping(0)


@pytest.mark.parametrize(
    "section, fragment",
    [
        ({"early_stopping_patience": 2, "every_steps": 10}, "set evaluation.metric_for_best"),
        ({"early_stopping_patience": 2, "metric_for_best": "xnli/accuracy"}, "evaluation.every_steps"),
        (
            {"early_stopping_patience": 0, "every_steps": 10, "metric_for_best": "xnli/accuracy"},
            "greater than or equal",
        ),
    ],
)
def test_bad_configs_get_one_clear_line(section, fragment):
    with pytest.raises(pydantic.ValidationError) as error:
        EvaluationSection(**section)
    assert fragment in str(error.value)


def test_a_complete_config_is_accepted():
    section = EvaluationSection(early_stopping_patience=2, every_steps=10, metric_for_best="xnli/accuracy")
    assert section.early_stopping_patience == 2
