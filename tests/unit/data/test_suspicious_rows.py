"""Rows a split cannot be trained or scored on are refused in one line naming the file, the row and the column
(never a tokenizer traceback); a training split with empty texts or repeated ids is used, but never silently:
one warning each, with counts, once per process."""

from __future__ import annotations

import json
import logging

import pytest

from mtft.core.errors import DataError
from mtft.data.pipeline import load_task_split
from mtft.tasks import discover_tasks

SENTIMENT = {"text_columns": ["text"], "id_column": "idx", "label_names": ["neg", "pos"]}
NER = {
    "head": "token_classification",
    "text_columns": ["tokens"],
    "label_column": "tags",
    "label_names": ["O", "B"],
    "metrics": ["f1"],
}
QA = {
    "head": "question_answering",
    "text_columns": ["question", "context"],
    "label_column": "answers",
    "metrics": ["f1"],
}


def load(tmp_path, kind, rows):
    """``rows`` as the training split of a task of ``kind``, through load_task_split."""
    folder = tmp_path / "tasks"
    folder.mkdir(exist_ok=True)
    spec = {
        "task": "t",
        "languages": ["en"],
        "data": {"train": {"path": "my/t", "name": "{language}", "split": "train"}},
        **kind,
    }
    (folder / "t.yaml").write_text(json.dumps(spec))
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = discover_tasks([folder])["t"]
    return load_task_split(task, "train", "en", "zero_shot", {"my/t": str(tmp_path / "train.jsonl")}, None)


def sentiment(i: int, text="") -> dict:
    return {"idx": str(i), "text": text or f"text {i}", "label": "pos"}


def words(i: int) -> dict:
    return {"tokens": ["a", f"w{i}"], "tags": ["O", "B"]}


def question(i: int) -> dict:
    return {"question": "which?", "context": f"this one {i}", "answers": {"text": ["one"], "answer_start": [5]}}


def test_empty_texts_and_repeated_ids_are_reported_once(tmp_path, caplog):
    rows = [{"idx": str(i % 3), "text": " " if i < 2 else f"text {i}", "label": "pos"} for i in range(5)]
    with caplog.at_level(logging.WARNING, logger="mtft"):
        dataset, where = load(tmp_path, SENTIMENT, rows)
        load(tmp_path, SENTIMENT, rows)  # a run loads its training splits more than once: one warning each
    assert len(dataset) == 5 and "train.jsonl" in where
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sum("2 empty text value(s)" in w for w in warnings) == 1
    assert sum("2 row(s) repeat an example id" in w for w in warnings) == 1
    assert all("train.jsonl" in w for w in warnings)


def test_empty_word_lists_are_reported(tmp_path, caplog):
    rows = [words(0), {"tokens": [], "tags": []}, {"tokens": [" "], "tags": ["O"]}]
    with caplog.at_level(logging.WARNING, logger="mtft"):
        load(tmp_path, NER, rows)
    assert any("2 empty text value(s) in columns tokens" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    "kind, good, column, bad, message",
    [
        (SENTIMENT, sentiment, "text", 5, "holds a number, not text"),  # one row: a mixed (Json) column
        (SENTIMENT, sentiment, "text", True, "holds a boolean, not text"),
        (SENTIMENT, sentiment, "text", ["a", "b"], "holds a list of strings, not text"),
        (SENTIMENT, sentiment, "text", {"a": 1}, r"holds a record \(JSON object\), not text"),
        (SENTIMENT, sentiment, "text", None, "missing value in column 'text'"),
        (NER, words, "tokens", "a b", r"holds text, not a list of words \(strings\)"),
        (NER, words, "tokens", [1, 2], r"holds a list, not a list of words"),
        (NER, words, "tokens", ["a", None], "missing word in column 'tokens'"),
        (NER, words, "tokens", None, "missing value in column 'tokens'"),
        (QA, question, "context", 5, "holds a number, not text"),
        (QA, question, "context", None, "missing value in column 'context'"),
        (QA, question, "question", {"q": "x"}, "holds a record"),
    ],
)
def test_a_bad_value_in_one_row_is_refused_with_file_row_and_column(tmp_path, kind, good, column, bad, message):
    rows = [good(i) for i in range(4)]
    rows[2][column] = bad
    with pytest.raises(DataError, match=rf"train.jsonl: row 2: .*{message}") as info:
        load(tmp_path, kind, rows)
    assert f"'{column}'" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    "kind, good, column, bad, message",
    [
        (SENTIMENT, sentiment, "text", 5, "holds int64 values, not text"),  # refused from the schema
        (SENTIMENT, sentiment, "text", [1], "holds lists of int64 values, not text"),
        (SENTIMENT, sentiment, "text", {"a": "b"}, r"holds records \(JSON objects\), not text"),
        (NER, words, "tokens", "a b", r"holds string values, not a list of words"),
        (NER, words, "tokens", [["a"]], r"holds lists of lists of string values, not a list of words"),
        (QA, question, "question", ["q"], "holds lists of string values, not text"),
    ],
)
def test_a_text_column_of_another_type_is_refused(tmp_path, kind, good, column, bad, message):
    rows = [{**good(i), column: bad} for i in range(3)]
    with pytest.raises(DataError, match=rf"train.jsonl: row 0: column '{column}' {message}"):
        load(tmp_path, kind, rows)


def layouts(tmp_path):
    """(task data entry, data.sources) of each way a training file is named: a data.sources pattern, and a task
    file that names its own files (the packaged json builder)."""
    pattern = str(tmp_path / "data" / "{name}" / "{split}.jsonl")
    own = str(tmp_path / "data" / "{language}" / "train.jsonl")
    return {
        "data.sources pattern": ({"path": "my/t", "name": "{language}", "split": "train"}, {"my/t": pattern}),
        "task file data_files": ({"path": "json", "data_files": own, "split": "train"}, {}),
    }


@pytest.mark.parametrize("layout", ["data.sources pattern", "task file data_files"])
@pytest.mark.parametrize(
    "rows, warning",
    [
        ([sentiment(0), sentiment(1, " ")], "1 empty text value(s)"),
        ([sentiment(0), sentiment(0)], "1 row(s) repeat an example id"),
    ],
)
def test_a_warning_names_the_task_the_language_and_the_file(tmp_path, caplog, layout, rows, warning):
    entry, sources = layouts(tmp_path)[layout]
    folder = tmp_path / "tasks"
    folder.mkdir()
    spec = {"task": "t", "languages": ["en", "de"], "data": {"train": entry}, **SENTIMENT}
    (folder / "t.yaml").write_text(json.dumps(spec))
    for lang, lines in (("en", [sentiment(i) for i in range(3)]), ("de", rows)):
        (tmp_path / "data" / lang).mkdir(parents=True)
        (tmp_path / "data" / lang / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    task = discover_tasks([folder])["t"]
    with caplog.at_level(logging.WARNING, logger="mtft"):
        for lang in ("en", "de"):
            load_task_split(task, "train", lang, "in_language", sources, None)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"task 't' language de, {tmp_path}/data/de/train.jsonl (split train): {warning}"
        + (" in columns text" if "empty" in warning else " of column 'idx'")
    ]


@pytest.mark.parametrize(
    "ids, warned",
    [
        ([[0, 5, 6, 2], [0, 7, 2]], False),
        ([[0, 3, 3, 2], [0, 7, 2]], True),  # 2 of 7 pieces unknown (id 3)
        ([[[0, 3, 2], [0, 3, 2]], [[0, 5, 2], [0, 6, 2]]], True),  # a choice task's nested ids
        ([[0, 5, 3] + [5] * 60], False),  # one unknown piece in 63: under the share
    ],
)
def test_a_split_mostly_unknown_to_the_tokenizer_is_said_once(caplog, ids, warned):
    import datasets

    from mtft.data.checks import warn_unknown_pieces

    where = f"split {len(ids)}-{sum(map(len, ids))}-{warned}"
    with caplog.at_level(logging.WARNING, logger="mtft"):
        for _ in range(2):
            warn_unknown_pieces(datasets.Dataset.from_dict({"input_ids": ids}), 3, where)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(where)]
    assert len(lines) == int(warned)
    assert not warned or "unknown to the tokenizer; the model sees <unk> there" in lines[0]
