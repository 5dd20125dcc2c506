"""Withheld labels: benchmark test sets whose gold labels are not public.

GLUE's and SuperGLUE's test splits on the Hub carry the label -1 in every row (ReCoRD: no answers), and GLUE's
diagnostic AX is such a split only: they are scored by the benchmarks' servers. A task declares the marker
with ``hidden_label`` (e.g. ``-1``). Such a split can be encoded and predicted -- the run writes its
predictions for submission -- but it can neither train nor be scored offline; both stop with an error that
says why, instead of scoring against -1 or silently skipping rows. A split that mixes hidden and real labels
is malformed and names its first hidden row.
"""

from __future__ import annotations

from typing import Any, Sequence

from mtft.core.errors import DataError
from mtft.core.labels import IGNORE_INDEX

HIDDEN_ENCODED = IGNORE_INDEX  # the encoded label of a hidden row: no loss


class HiddenLabelsError(DataError):
    """The split's labels are withheld (a benchmark test set): there is nothing to score against."""


def is_hidden(task: Any, value: Any) -> bool:
    marker = getattr(task, "hidden_label", None)
    if marker is None or isinstance(value, bool):
        return False
    if isinstance(value, (list, tuple)):  # ReCoRD: a query without answers
        return marker == [] and len(value) == 0
    return value == marker


def hidden_rows(task: Any, values: Sequence[Any]) -> list[bool]:
    return [is_hidden(task, v) for v in values]


def check_not_hidden(task: Any, values: Sequence[Any], where: str, purpose: str = "scored") -> None:
    """Raise :class:`HiddenLabelsError` when every label is hidden, :class:`DataError` when some are."""
    hidden = hidden_rows(task, values)
    if values and all(hidden):
        raise HiddenLabelsError(
            f"{where}: the labels of this split are withheld ({task.hidden_label!r} in every row, as "
            f"on the Hub for benchmark test sets), so it cannot be {purpose}; its predictions are what the "
            "benchmark's server scores. Use the validation split, or pass labelled references"
        )
    if any(hidden):
        raise DataError(
            f"{where}: row {hidden.index(True)}: label withheld ({task.hidden_label!r}) while other rows are labelled"
        )
