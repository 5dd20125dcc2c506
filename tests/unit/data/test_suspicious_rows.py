"""A training split with empty texts or repeated ids is used, but never silently: one warning each, with counts."""

from __future__ import annotations

import json
import logging

import pytest

from mtft.core.errors import DataError
from mtft.data.pipeline import load_task_split
from mtft.tasks import discover_tasks


def sentiment(tmp_path, rows):
    folder = tmp_path / "tasks"
    folder.mkdir()
    spec = {
        "task": "sent",
        "languages": ["en"],
        "text_columns": ["text"],
        "id_column": "idx",
        "label_names": ["neg", "pos"],
        "data": {"train": {"path": "my/sent", "name": "{language}", "split": "train"}},
    }
    (folder / "sent.yaml").write_text(json.dumps(spec))
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return discover_tasks([folder])["sent"], {"my/sent": str(tmp_path / "train.jsonl")}


def test_empty_texts_and_repeated_ids_are_reported(tmp_path, caplog):
    rows = [{"idx": str(i % 3), "text": "" if i < 2 else f"text {i}", "label": "pos"} for i in range(5)]
    task, sources = sentiment(tmp_path, rows)
    with caplog.at_level(logging.WARNING, logger="mtft"):
        dataset, where = load_task_split(task, "train", "en", "zero_shot", sources, str(tmp_path / "cache"))
    assert len(dataset) == 5 and "train.jsonl" in where
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("2 empty text value(s)" in w for w in warnings)
    assert any("2 row(s) repeat an example id" in w for w in warnings)


def test_a_text_column_of_numbers_is_refused(tmp_path):
    task, sources = sentiment(tmp_path, [{"idx": str(i), "text": i, "label": "pos"} for i in range(3)])
    with pytest.raises(DataError, match=r"train.jsonl.*column 'text' holds int64 values, not text"):
        load_task_split(task, "train", "en", "zero_shot", sources, str(tmp_path / "cache"))
