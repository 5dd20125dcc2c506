"""mtft.api.inputs and entity spans: new input checked against a task's columns, given placeholder labels of the
task's form (never read by decoding) and row-number ids; BIO tags read back as word spans."""

from __future__ import annotations

import dataclasses

import datasets
import pytest

from mtft.api.inputs import from_records, prepare_input
from mtft.core.errors import DataError
from mtft.tasks import discover_tasks, get_task
from mtft.tasks.token_classification import entities

TASKS = discover_tasks([])


def task(name: str):
    return get_task(name, TASKS)


def test_missing_input_columns_are_named_with_what_the_task_reads():
    rows = datasets.Dataset.from_list([{"premise": "a", "text": "b"}])
    with pytest.raises(DataError) as error:
        prepare_input(task("xnli"), rows, "in.csv")
    assert str(error.value) == (
        "in.csv: missing column(s) hypothesis needed by task 'xnli' (sequence_classification: reads premise, "
        "hypothesis); it has: premise, text"
    )


@pytest.mark.parametrize(
    "name, row, label",
    [
        ("xnli", {"premise": "a", "hypothesis": "b"}, 0),
        ("wikiann", {"tokens": ["Ada", "Lovelace", "wrote"]}, [0, 0, 0]),
        ("tydiqa", {"id": "english-1", "question": "who?", "context": "Ada."}, {"text": ["A"], "answer_start": [0]}),
        ("glue_stsb", {"idx": 3, "sentence1": "a", "sentence2": "b"}, -1),  # GLUE's withheld-label marker
    ],
)
def test_unlabelled_rows_get_a_placeholder_label_of_the_tasks_form(name, row, label, tmp_path):
    prepared = prepare_input(task(name), datasets.Dataset.from_list([row]), "input")
    assert prepared[task(name).label_column] == [label]
    # and the task encodes them as it encodes a labelled split
    encoded = task(name).encode_rows(prepared[:], [0], _tokenizer(tmp_path), 256, ["O", "B-PER", "I-PER"], "input")
    assert encoded["id"] and encoded["input_ids"]


def test_ids_are_row_numbers_where_the_input_has_none():
    prepared = prepare_input(
        task("glue_stsb"), datasets.Dataset.from_list([{"sentence1": "a", "sentence2": "b"}] * 2), "x"
    )
    assert prepared["idx"] == ["0", "1"]


def test_a_task_kind_without_a_placeholder_asks_for_its_label_column():
    record = dataclasses.replace(task("superglue_record"), hidden_label=None)
    with pytest.raises(DataError, match="give its label column"):
        record.placeholder_label({})


def test_records_are_plain_texts_for_a_one_column_task_and_dicts_otherwise():
    assert from_records(["a b", "c"], task("glue_sst2"))["sentence"] == ["a b", "c"]
    with pytest.raises(DataError, match="pass one dict per row"):
        from_records(["a"], task("xnli"))
    with pytest.raises(DataError, match="no rows"):
        from_records([], task("xnli"))


def test_entities_are_read_from_bio_tags_as_word_spans():
    words = ["Ada", "Lovelace", "met", "Babbage", "in", "London", "UK"]
    tags = ["B-PER", "I-PER", "O", "I-PER", "O", "B-LOC", "B-LOC"]
    assert entities(tags, words) == [
        {"type": "PER", "start": 0, "end": 2, "text": "Ada Lovelace"},
        {"type": "PER", "start": 3, "end": 4, "text": "Babbage"},  # an I- after O opens a span
        {"type": "LOC", "start": 5, "end": 6, "text": "London"},
        {"type": "LOC", "start": 6, "end": 7, "text": "UK"},  # B- opens another
    ]
    assert entities(["B-PER", "I-LOC"], ["a", "b"]) == [
        {"type": "PER", "start": 0, "end": 1, "text": "a"},
        {"type": "LOC", "start": 1, "end": 2, "text": "b"},
    ]


def _tokenizer(folder):
    from mtft.models.tokenizer import tiny_tokenizer

    return tiny_tokenizer(["Ada Lovelace wrote who a b"] * 4, 200, folder)
