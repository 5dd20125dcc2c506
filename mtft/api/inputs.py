"""New input for a trained task: a data file, a Hub dataset or local folder, or rows in memory, checked against
the task's columns and made encodable.

The task's own encoding (:meth:`~mtft.tasks.base.Task.encode_rows`) writes labels, which new text does not have:
a missing label column is filled with a placeholder the head never reads (decoding looks at the logits only) --
the task's withheld-label marker where it declares one (GLUE's ``-1``: no loss, as on the Hub's test splits), else
a valid label of the task's kind. A missing id column is filled with the row numbers. Every other column the task
reads must be there: a file whose columns do not fit is refused in one line naming them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import datasets

from mtft.core.errors import DataError
from mtft.data.checks import check_rows
from mtft.data.sources import check_local_files, load_split
from mtft.tasks.base import DatasetRef, Task

FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


def load_input(
    task: Task,
    source: str,
    split: str,
    language: Optional[str],
    protocol: str,
    sources: Mapping[str, str],
    cache_dir: Optional[str],
) -> tuple[datasets.Dataset, str]:
    """(rows, where they came from) of ``source``: a .jsonl/.json/.csv/.parquet file (every row), or a Hub id or
    local folder in the Hub layout loaded as the task loads its own (``split``, and the task's config for
    ``language``, e.g. XNLI's ``de``), through the run's ``data.sources`` when it is the task's own Hub id."""
    path = Path(source)
    builder = FILE_BUILDERS.get(path.suffix.lower())
    if builder is not None and not path.is_dir():
        ref = DatasetRef(path=builder, split="train", data_files=str(path))
        check_local_files(ref)
        return load_split(ref), str(path)
    if path.suffix and not path.is_dir() and path.exists():
        raise DataError(f"--input {source}: not a {'/'.join(FILE_BUILDERS)} file, a dataset folder or a Hub id")
    try:
        own = task.dataset_ref(split, language or task.source_language, protocol)
    except DataError:  # the task has no such split: the input's split is still read
        own = DatasetRef(path=source, split=split)
    ref = DatasetRef(path=source, split=split, name=own.name, language=own.language)
    dataset = load_split(ref, sources if source == own.path else {}, cache_dir)
    where = f"{source} split {split}"
    if task.language_id_prefixes and language and task.id_column in dataset.column_names:
        dataset = dataset.select(task.language_rows(dataset, language, where) or range(len(dataset)))
    return dataset, where


def from_records(records: Sequence[Any], task: Task) -> datasets.Dataset:
    """Rows in memory as a dataset: dicts of the task's columns, or for a task with one text column plain texts
    (a list of words each for token classification)."""
    rows = list(records)
    if rows and not isinstance(rows[0], Mapping):
        if len(task.text_columns) != 1:
            raise DataError(
                f"task {task.name!r} reads the columns {', '.join(task.required_columns())}: pass one dict per row"
            )
        rows = [{task.text_columns[0]: value} for value in rows]
    if not rows:
        raise DataError(f"task {task.name!r}: nothing to predict (no rows)")
    return datasets.Dataset.from_list(rows)


def prepare_input(task: Task, dataset: datasets.Dataset, where: str, offset: int = 0) -> datasets.Dataset:
    """``dataset`` (rows ``offset``... of the input, for messages) checked as a split is (columns, values, the
    task's own checks), with a placeholder label column and row-number ids where it has none."""
    needed = [c for c in task.required_columns() if c not in (task.label_column, task.id_column)]
    missing = [c for c in needed if c not in dataset.column_names]
    if missing:
        raise DataError(
            f"{where}: missing column(s) {', '.join(missing)} needed by task {task.name!r} "
            f"({task.head}: reads {', '.join(needed)}); it has: {', '.join(dataset.column_names) or 'no columns'}"
        )
    if len(dataset) == 0:
        raise DataError(f"{where}: no rows")
    if task.id_column and task.id_column not in dataset.column_names:
        dataset = dataset.add_column(task.id_column, [str(offset + i) for i in range(len(dataset))])
    if task.label_column not in dataset.column_names:
        dataset = dataset.add_column(task.label_column, [placeholder(task, row) for row in dataset])
    rows = range(offset, offset + len(dataset))
    check_rows(task, dataset, where, rows)
    dataset = task.check_split(dataset, where, rows)
    if len(dataset) == 0:
        raise DataError(f"{where}: no rows left to predict")
    return dataset


def placeholder(task: Task, row: Mapping[str, Any]) -> Any:
    """The label an unlabelled input row is given: the task's withheld-label marker where it has one, else a label
    of its kind's form (:meth:`mtft.tasks.base.Task.placeholder_label`); prediction never reads it."""
    return task.hidden_label if task.hidden_label is not None else task.placeholder_label(row)
