"""One table of the head kinds: each kind names the Task class and the Head class that work as a pair.

The task kind writes the ``labels`` of an encoded row and turns the head's raw outputs back into predictions;
the head (:mod:`mtft.models.heads`) collates those labels, computes the loss and decodes its logits. Keeping
both in one row means a kind cannot have a task without its head, or a head reading labels no task writes.
A task file picks its kind with ``head:`` (and may name a Task subclass of its own with ``class:``); the run
builds the head of that kind. A new kind adds one loader here (or :func:`register_kind` from outside): its
``import`` statements bring in the pair when a run first uses the kind, so that only the kinds a run uses are
imported, and import-linter sees them (two :class:`mtft.core.registry.Registry` with the same names, one of Task
classes, one of Head classes). A task file's own ``class:`` is checked by the Task registry's rules too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence, Union

from mtft.core.registry import Registry

if TYPE_CHECKING:
    from mtft.models.heads import Head
    from mtft.tasks.base import Task


TASK_CLASSES: Registry[Task] = Registry("head", "mtft.tasks.base:Task", by_path=False)
HEAD_CLASSES: Registry[Head] = Registry("head", "mtft.models.heads:Head", by_path=False)


def _kind(name: str) -> Callable[[Callable[[], tuple[type, type]]], None]:
    """Decorator of a loader of kind ``name``'s (Task class, Head class): each half enrolled in its registry, both
    imported together when either is first asked for."""

    def enrol(load: Callable[[], tuple[type, type]]) -> None:
        TASK_CLASSES.lazy(name)(lambda: load()[0])
        HEAD_CLASSES.lazy(name)(lambda: load()[1])

    return enrol


@_kind("sequence_classification")
def _sequence_classification() -> tuple[type, type]:
    from mtft.models.heads import SequenceClassificationHead
    from mtft.tasks.base import Task

    return Task, SequenceClassificationHead


@_kind("token_classification")
def _token_classification() -> tuple[type, type]:
    from mtft.models.token_head import TokenClassificationHead
    from mtft.tasks.token_classification import TokenClassificationTask

    return TokenClassificationTask, TokenClassificationHead


@_kind("question_answering")
def _question_answering() -> tuple[type, type]:
    from mtft.models.qa_head import QuestionAnsweringHead
    from mtft.tasks.extractive_qa import ExtractiveQATask

    return ExtractiveQATask, QuestionAnsweringHead


@_kind("regression")
def _regression() -> tuple[type, type]:
    from mtft.models.regression_head import RegressionHead
    from mtft.tasks.regression import RegressionTask

    return RegressionTask, RegressionHead


@_kind("multiple_choice")
def _multiple_choice() -> tuple[type, type]:
    from mtft.models.choice_head import MultipleChoiceHead
    from mtft.tasks.multiple_choice import MultipleChoiceTask

    return MultipleChoiceTask, MultipleChoiceHead


@_kind("candidate_scoring")
def _candidate_scoring() -> tuple[type, type]:
    from mtft.models.choice_head import CandidateScoringHead
    from mtft.tasks.superglue import RecordTask

    return RecordTask, CandidateScoringHead


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


def task_kind(kind: str) -> type[Task]:
    """The Task class of head kind ``kind``; ValueError naming the valid kinds."""
    return TASK_CLASSES.get(kind)


def head_class(kind: str) -> type[Head]:
    """The Head class of head kind ``kind``; ValueError naming the valid kinds."""
    return HEAD_CLASSES.get(kind)


def build_head(kind: str, hidden_size: int, label_names: Sequence[str], dropout: float) -> Head:
    return head_class(kind)(hidden_size, label_names, dropout)
