"""Best-checkpoint selection's bookkeeping (mtft.training.selection.Selection), on its own since issue 30: which
split an evaluation scores, and its state in the training checkpoint."""

from __future__ import annotations

from mtft.config import validate_config
from mtft.evaluation.evaluate import Evaluation
from mtft.training.selection import Selection


def selection(**evaluation) -> tuple[Selection, list]:
    raw = {"data": {"tasks": [{"name": "xnli", "languages": ["en"]}], "dev_split": 0.2}, "evaluation": evaluation}
    chosen = Selection(validate_config(raw, source="test"), None, None, None, None, is_main=False)
    scored: list = []

    def score(step, log, dev):
        scored.append((step, "dev" if dev else "test"))
        return Evaluation({}, {})

    chosen._score = score  # type: ignore[method-assign]
    return chosen, scored


def test_with_a_dev_split_training_scores_dev_and_the_end_scores_test_once_more():
    chosen, scored = selection()
    chosen.evaluate(10, None, final=False)
    chosen.evaluate(20, None, final=True)
    assert scored == [(10, "dev"), (20, "dev"), (20, "test")]


def test_the_end_of_an_early_stop_does_not_score_its_dev_set_twice():
    chosen, scored = selection()
    chosen.evaluate(10, None, final=False)
    chosen.evaluate(10, None, final=True)  # the loop broke at step 10 after its dev evaluation
    assert scored == [(10, "dev"), (10, "test")]


def test_the_state_travels_in_the_checkpoint():
    chosen, _ = selection(metric_for_best="xnli/accuracy", early_stopping_patience=3, every_steps=10)
    chosen.best = {"metric": "xnli/source_accuracy", "value": 0.7, "step": 10}
    chosen.early_stopping.update(0.7)
    chosen.early_stopping.update(0.6)
    again, _ = selection(metric_for_best="xnli/accuracy", early_stopping_patience=3, every_steps=10)
    again.load_state_dict(chosen.state_dict())
    assert again.best == chosen.best and again.early_stopping.state_dict() == chosen.early_stopping.state_dict()
    older, _ = selection(metric_for_best="xnli/accuracy", early_stopping_patience=3, every_steps=10)
    older.load_state_dict({"best": chosen.best})  # a checkpoint from before early stopping
    assert older.early_stopping.best == 0.7 and not older.should_stop
