"""Score predictions keyed by example id against a split's references: shared by evaluation and ``run.py score``.

Every reference needs exactly one well-formed prediction; a missing, unknown or malformed one is an error
that names the row (and the file, when the predictions come from one), so nothing is silently dropped.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from mtft.core.errors import DataError
from mtft.tasks.base import Task


def score(
    task: Task,
    predictions: Mapping[str, Any],
    references: Mapping[str, Any],
    label_names: Sequence[str],
    where: str,
    rows: Optional[Mapping[str, int]] = None,
) -> dict[str, float]:
    """The task's metrics over ``references`` (in their order). ``rows``: id -> row of the predictions file."""
    missing = [i for i in references if i not in predictions]
    if missing:
        shown = ", ".join(repr(i) for i in missing[:5]) + (
            f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        )
        raise DataError(
            f"{where}: task {task.name!r}: no prediction for {len(missing)} of {len(references)} example id(s): {shown}"
        )
    unknown = [i for i in predictions if i not in references]
    if unknown:
        raise DataError(
            f"{where}{_row(rows, unknown[0])}: task {task.name!r}: unknown example id {unknown[0]!r} "
            f"({len(unknown)} unknown in all)"
        )
    for key, reference in references.items():
        problem = task.check_prediction(predictions[key], reference, label_names)
        if problem:
            raise DataError(f"{where}{_row(rows, key)}: task {task.name!r}: example {key!r}: {problem}")
    ids = list(references)
    return task.compute_metrics([predictions[i] for i in ids], [references[i] for i in ids])


def _row(rows: Optional[Mapping[str, int]], key: str) -> str:
    return f": row {rows[key]}" if rows and key in rows else ""
