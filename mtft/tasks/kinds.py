"""Which :class:`~mtft.tasks.base.Task` class a declarative task file gets for its ``head``.

Each head kind (:data:`mtft.models.heads.HEAD_CLASSES`) has a task kind that writes the labels the head
reads and turns its outputs back into predictions. A task file may name its own subclass with ``class:``.
A new kind adds one line here (by import path, so that only the kinds in use are imported).
"""

from __future__ import annotations

import importlib

TASK_KINDS: dict[str, str] = {
    "sequence_classification": "mtft.tasks.base:Task",
    "token_classification": "mtft.tasks.token_classification:TokenClassificationTask",
    "question_answering": "mtft.tasks.extractive_qa:ExtractiveQATask",
    "regression": "mtft.tasks.regression:RegressionTask",
    "multiple_choice": "mtft.tasks.multiple_choice:MultipleChoiceTask",
    "candidate_scoring": "mtft.tasks.superglue:RecordTask",
}


def task_kind(head: str):
    """The Task class for ``head``; KeyError naming the valid heads."""
    if head not in TASK_KINDS:
        raise KeyError(f"unknown head {head!r}; valid heads: {', '.join(sorted(TASK_KINDS))}")
    module, _, name = TASK_KINDS[head].partition(":")
    return getattr(importlib.import_module(module), name)
