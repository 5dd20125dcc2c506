"""A data file that does not parse is one DataError naming the file, and nothing else: ``load_split`` (which
``run.py predict --input`` reads through too) silences the ``datasets`` loggers, whose json builder logs the
parse error itself before raising it."""

from __future__ import annotations

import logging

import pytest

from mtft.core.errors import DataError
from mtft.data.sources import load_split
from mtft.tasks.base import DatasetRef

GOOD = '{"text": "a", "label": 0}\n'


@pytest.mark.parametrize(
    "name, content",
    [
        ("train.jsonl", GOOD + "{oops\n"),
        ("train.jsonl", GOOD + '{"text": "b", "label": 1\n'),
        ("train.json", "[" + GOOD),
        ("train.jsonl", GOOD + "not json at all\n"),
    ],
)
def test_a_malformed_file_is_one_error_and_no_log_line(tmp_path, name, content):
    (tmp_path / name).write_text(content)
    library, records = logging.getLogger("datasets"), []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    library.addHandler(handler)
    level = library.level
    try:
        with pytest.raises(DataError, match=f"cannot load {tmp_path / name}"):
            load_split(DatasetRef(path="json", data_files=str(tmp_path / name), split="train"), {}, str(tmp_path))
    finally:
        library.removeHandler(handler)
    assert [r.getMessage() for r in records] == []
    assert library.level == level  # restored
