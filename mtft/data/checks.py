"""Checks of a split's rows before anything tokenises them, read from the Arrow schema and Arrow's vectorised
kernels rather than a Python pass over every value.

A text column must hold text: a string per row, or for a word-level task (``Task.text_value == "words"``) a list
of strings. A column of another type is refused from its ``datasets`` feature alone; a JSON file that mixes
types in one column loads as a ``Json`` feature, and only then are its values looked at, to name the first bad
row. A missing value (JSON ``null``, an absent key, a ``null`` inside a word list) in any column the task reads
is found by Arrow's null counts. Either way the error is one line naming the file, the row and the column, not
a tokenizer traceback.
"""

from __future__ import annotations

import logging
from typing import Any, Optional, Sequence

import datasets
import pyarrow as pa
import pyarrow.compute as pc

from mtft.core.errors import DataError, echo
from mtft.tasks.base import Task
from mtft.tasks.columns import column_values

logger = logging.getLogger("mtft")

_STRINGS = ("string", "large_string")
_LISTS = (datasets.List, datasets.Sequence, datasets.LargeList)
_EXPECTED = {"text": "text", "words": "a list of words (strings)"}
# warnings already given by this process: a run loads a training split more than once (the tokenizer's texts,
# SURT's texts, the training data), and says what is suspicious about it once
_WARNED: set[str] = set()


def check_rows(task: Task, dataset: datasets.Dataset, where: str, rows: Sequence[int]) -> None:
    """Refuse a missing value in a column ``task`` reads, or a text column that does not hold text, in one
    :class:`DataError` naming the file, the row (``rows[n]``: the source row of position ``n``) and the column."""
    table = dataset.with_format("arrow")
    for column in task.required_columns():
        if column in dataset.column_names:
            array = _combined(table[column])
            if array.null_count:
                row = rows[int(pc.index(array.is_null(), True).as_py())]
                raise DataError(f"{where}: row {row}: missing value in column {column!r}")
    for column in task.text_columns:
        if column in dataset.column_names:
            _check_text_column(task, dataset, _combined(table[column]), column, where, rows)


def _check_text_column(
    task: Task, dataset: datasets.Dataset, array: pa.Array, column: str, where: str, rows: Sequence[int]
) -> None:
    feature, words = dataset.features[column], task.text_value == "words"
    expected = _EXPECTED[task.text_value]
    inner = feature.feature if words and isinstance(feature, _LISTS) else None
    if isinstance(feature, datasets.Json) or isinstance(inner, datasets.Json):  # mixed types: find the first bad
        for n, value in enumerate(column_values(dataset, column)):
            if value is None:
                raise DataError(f"{where}: row {rows[n]}: missing value in column {column!r}")
            if not _holds(value, words):
                raise DataError(
                    f"{where}: row {rows[n]}: column {column!r} holds {_value_kind(value)}, not {expected} "
                    f"(task {task.name!r}): {echo(value)}"
                )
        return
    strings = _STRINGS + ("null",) if words else _STRINGS  # a column of empty word lists has no value type
    value = inner if words else feature
    if not (isinstance(value, datasets.Value) and value.dtype in strings):
        raise DataError(
            f"{where}: row {rows[0]}: column {column!r} holds {_feature_kind(feature)}, not {expected} "
            f"(task {task.name!r}): {echo(array[0].as_py())}"
        )
    if words:
        flat = array.flatten()
        if flat.null_count:
            row = rows[int(pc.list_parent_indices(array)[int(pc.index(flat.is_null(), True).as_py())].as_py())]
            raise DataError(f"{where}: row {row}: missing word in column {column!r} (task {task.name!r})")


def warn_suspicious_rows(task: Task, dataset: datasets.Dataset, where: str) -> None:
    """Empty texts and repeated example ids in a training split: said once per split and process, with counts and
    the file, never silently passed.

    Both are warned of, not refused: each is legal and found in public training data (an empty hypothesis, an
    example listed twice); an empty text trains its label on the special tokens alone and a repeated example
    counts twice, which the user should know but may intend. Where a repeated id would be wrong it is refused
    there: in an evaluation split (:func:`mtft.tasks.base.unique_by_id`) and by data.leave_out
    (:func:`mtft.data.leave_out.removed_ids`), which removes examples by id."""
    table = dataset.with_format("arrow")
    empty = sum(_empty(_combined(table[c])) for c in task.text_columns if c in dataset.column_names)
    if empty:
        _warn_once(f"{where}: {empty} empty text value(s) in columns {', '.join(task.text_columns)}")
    if task.id_column and task.id_column in dataset.column_names:
        ids = _combined(table[task.id_column])
        try:
            distinct = pc.count_distinct(ids.cast(pa.string())).as_py()
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # ids Arrow cannot cast: as Python strings
            distinct = len({str(value) for value in ids.to_pylist()})
        if len(ids) - distinct:
            _warn_once(f"{where}: {len(ids) - distinct} row(s) repeat an example id of column {task.id_column!r}")


UNKNOWN_SHARE = 0.02  # above this share of unknown word pieces, a split's text is mostly not what the tokenizer knows


def warn_unknown_pieces(encoded: datasets.Dataset, unknown_id: Optional[int], where: str) -> None:
    """A split whose word pieces are more than :data:`UNKNOWN_SHARE` unknown is said once: a tokenizer that does not
    know the split's script or language (a vocabulary cut to a run's own texts, ``model.vocabulary: used``, knows no
    other), whose encoder would see mostly ``<unk>``."""
    if unknown_id is None or "input_ids" not in encoded.column_names or not len(encoded):
        return
    ids = _combined(encoded.with_format("arrow")["input_ids"])
    while pa.types.is_list(ids.type) or pa.types.is_large_list(ids.type):  # a choice task nests its ids
        ids = pc.list_flatten(ids)
    share = pc.sum(pc.equal(ids, unknown_id)).as_py() / max(len(ids), 1)
    if share > UNKNOWN_SHARE:
        _warn_once(
            f"{where}: {share:.0%} of its word pieces are unknown to the tokenizer; the model sees <unk> there "
            "(a vocabulary cut to a run's own texts, model.vocabulary: used, knows no other language or script)"
        )


def _empty(array: pa.Array) -> int:
    """How many rows of a text column are blank: whitespace only, or for words, no word that is not."""
    if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
        if pa.types.is_null(array.type.value_type):  # a column of empty word lists only
            return len(array)
        array = pc.binary_join(array, " ")
    if not (pa.types.is_string(array.type) or pa.types.is_large_string(array.type)):
        return 0
    return pc.sum(pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(array)), 0)).as_py() or 0


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        logger.warning(message)


def _combined(column: Any) -> pa.Array:
    """A column of an Arrow-formatted dataset as one array (row positions index it directly)."""
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _holds(value: Any, words: bool) -> bool:
    if words:
        return isinstance(value, list) and all(isinstance(word, str) for word in value)
    return isinstance(value, str)


def _value_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, list):
        return "a list of strings" if value and all(isinstance(v, str) for v in value) else "a list"
    if isinstance(value, dict):
        return "a record (JSON object)"
    return "text" if isinstance(value, str) else type(value).__name__


def _feature_kind(feature: Any) -> str:
    if isinstance(feature, datasets.Value):
        return f"{feature.dtype} values"
    if isinstance(feature, _LISTS):
        return f"lists of {_feature_kind(feature.feature)}"
    if isinstance(feature, dict):
        return "records (JSON objects)"
    if isinstance(feature, datasets.ClassLabel):
        return "class labels"
    return f"{type(feature).__name__} values"
