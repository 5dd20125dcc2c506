"""The one table of head kinds: every kind pairs a Task class with the Head class of the same kind."""

from __future__ import annotations

import pytest

import mtft.models.heads
from mtft.models.heads import Head
from mtft.tasks.base import Task
from mtft.tasks.kinds import HEAD_CLASSES, TASK_CLASSES, build_head, head_class, task_kind


def test_every_kind_is_enrolled_with_both_halves():
    assert TASK_CLASSES.names() == HEAD_CLASSES.names()


@pytest.mark.parametrize("kind", TASK_CLASSES.names())
def test_every_kind_has_a_task_class_and_a_head_class_of_that_kind(kind):
    assert issubclass(task_kind(kind), Task)
    assert issubclass(head_class(kind), Head) and head_class(kind).kind == kind
    head = build_head(kind, 8, ["a", "b"], 0.0)
    assert type(head) is head_class(kind) and head.label_names == ["a", "b"]


def test_unknown_kind_names_the_valid_kinds():
    valid = (
        "candidate_scoring, multiple_choice, question_answering, regression, sequence_classification, "
        "token_classification"
    )
    for lookup in (task_kind, head_class):
        with pytest.raises(ValueError, match=f"unknown head 'parsing'; valid choices: {valid}$"):
            lookup("parsing")


def test_models_keep_no_registry_of_their_own():
    """One table: the models layer defines heads, the tasks layer says which kind uses which."""
    assert not {"HEAD_CLASSES", "head_class", "build_head"} & set(vars(mtft.models.heads))
