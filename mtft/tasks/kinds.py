"""One table of the head kinds: each kind names the Task class and the Head class that work as a pair.

The task kind writes the ``labels`` of an encoded row and turns the head's raw outputs back into predictions;
the head (:mod:`mtft.models.heads`) collates those labels, computes the loss and decodes its logits. Keeping
both in one row means a kind cannot have a task without its head, or a head reading labels no task writes.
A task file picks its kind with ``head:`` (and may name a Task subclass of its own with ``class:``); the run
builds the head of that kind. A new kind adds one row here (or :func:`register_kind` from outside). Classes are
named by import path, so that only the kinds a run uses are imported (two :class:`mtft.core.registry.Registry`
with the same names, one of Task classes, one of Head classes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Sequence, Union

from mtft.core.registry import Registry

if TYPE_CHECKING:
    from mtft.models.heads import Head
    from mtft.tasks.base import Task


class Kind(NamedTuple):
    task: str  # "module:Class" of the Task subclass
    head: str  # "module:Class" of the Head subclass


KINDS: dict[str, Kind] = {
    "sequence_classification": Kind("mtft.tasks.base:Task", "mtft.models.heads:SequenceClassificationHead"),
    "token_classification": Kind(
        "mtft.tasks.token_classification:TokenClassificationTask", "mtft.models.token_head:TokenClassificationHead"
    ),
    "question_answering": Kind(
        "mtft.tasks.extractive_qa:ExtractiveQATask", "mtft.models.qa_head:QuestionAnsweringHead"
    ),
    "regression": Kind("mtft.tasks.regression:RegressionTask", "mtft.models.regression_head:RegressionHead"),
    "multiple_choice": Kind(
        "mtft.tasks.multiple_choice:MultipleChoiceTask", "mtft.models.choice_head:MultipleChoiceHead"
    ),
    "candidate_scoring": Kind("mtft.tasks.superglue:RecordTask", "mtft.models.choice_head:CandidateScoringHead"),
}


TASK_CLASSES: Registry[Task] = Registry("head", "mtft.tasks.base:Task", by_path=False)
HEAD_CLASSES: Registry[Head] = Registry("head", "mtft.models.heads:Head", by_path=False)


def register_kind(name: str, task: Union[type, str], head: Union[type, str]) -> None:
    """Make ``head: <name>`` a kind of task file: its Task class and its Head class (classes or ``module:Class``).
    A name taken by other classes is refused, and then neither half is registered."""
    before = TASK_CLASSES.snapshot()
    TASK_CLASSES.add(name, task)
    try:
        HEAD_CLASSES.add(name, head)
    except ValueError:
        TASK_CLASSES.restore(before)
        raise


for _name, _kind in KINDS.items():
    register_kind(_name, *_kind)


def task_kind(kind: str) -> type[Task]:
    """The Task class of head kind ``kind``; ValueError naming the valid kinds."""
    return TASK_CLASSES.get(kind)


def head_class(kind: str) -> type[Head]:
    """The Head class of head kind ``kind``; ValueError naming the valid kinds."""
    return HEAD_CLASSES.get(kind)


def build_head(kind: str, hidden_size: int, label_names: Sequence[str], dropout: float) -> Head:
    return head_class(kind)(hidden_size, label_names, dropout)
