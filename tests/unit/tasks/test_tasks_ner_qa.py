"""WikiANN (token classification) and TyDiQA-GoldP (extractive QA): loading, preprocessing round trips,
post-processing, metric wiring, settings and offset checks."""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

import datasets
import pytest

from mtft.core.errors import ConfigError, DataError
from mtft.core.labels import IGNORE_INDEX
from mtft.data.pipeline import load_task_split
from mtft.fixtures import tydiqa as tydiqa_fixture
from mtft.fixtures import wikiann as wikiann_fixture
from mtft.models.tokenizer import tiny_tokenizer
from mtft.tasks import discover_tasks
from mtft.tasks.extractive_qa import NOT_CONTEXT, answer_span, best_spans
from tests.helpers.launch import REPO
from tests.helpers.tasks import SOURCES, write_tydiqa_copy

TASKS = discover_tasks()


def load(task, split, language, sources=SOURCES, protocol=None):
    return load_task_split(task, split, language, protocol or task.default_protocol, sources, None)[0]


@pytest.fixture(scope="module")
def tokenizer():
    texts = []
    for lang in ("en", "ko"):
        texts += TASKS["wikiann"].texts(load(TASKS["wikiann"], "train", lang))
    texts += TASKS["tydiqa"].texts(load(TASKS["tydiqa"], "train", "en"))
    return tiny_tokenizer(texts, 400, Path(os.environ["MTFT_CACHE"]))


def encode(task, dataset, tokenizer, max_length, label_names=()):
    return datasets.Dataset.from_dict(
        task.encode_rows(dataset[:], list(range(len(dataset))), tokenizer, max_length, list(label_names), "test")
    )


# ----- WikiANN --------------------------------------------------------------------------------------------------
def test_wikiann_hub_schema_48_configs_and_tag_names_from_the_sequence_classlabel():
    task = TASKS["wikiann"]
    assert type(task).__name__ == "TokenClassificationTask" and len(task.languages) == 48
    assert task.languages == wikiann_fixture.LANGUAGES
    dataset = load(task, "validation", "ja")
    assert dataset.column_names == ["tokens", "ner_tags", "langs", "spans"]
    assert isinstance(dataset.features["ner_tags"].feature, datasets.ClassLabel)
    assert task.resolve_label_names(dataset) == ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC"]
    row = dataset[0]
    assert row["langs"] == ["ja"] * len(row["tokens"]) and len(row["ner_tags"]) == len(row["tokens"])
    configs = datasets.get_dataset_config_names(SOURCES["unimelb-nlp/wikiann"])
    assert sorted(configs) == sorted(wikiann_fixture.LANGUAGES)


def test_ner_labels_sit_on_first_subtokens_and_realign_with_words(tokenizer):
    task = TASKS["wikiann"]
    raw = load(task, "validation", "en")
    names = task.resolve_label_names(raw)
    encoded = encode(task, raw, tokenizer, 64, names)
    assert len(encoded) == len(raw) and encoded["id"][:2] == ["0", "1"]
    multi_piece = 0
    for row, enc in zip(raw, encoded):
        words = [w for w in enc["word_ids"] if w >= 0]
        assert sorted(set(words)) == list(range(len(row["tokens"])))
        labelled = [(p, lab) for p, lab in enumerate(enc["labels"]) if lab != IGNORE_INDEX]
        firsts = [enc["word_ids"].index(w) for w in range(len(row["tokens"]))]
        assert [p for p, _ in labelled] == firsts  # exactly the first sub-token of each word
        assert [lab for _, lab in labelled] == row["ner_tags"]
        multi_piece += len(words) > len(row["tokens"])
    assert multi_piece > 0  # the round trip was tested on words split into several sub-tokens
    # decoding the gold tags at every token gives back the word-level tags
    outputs = [[names[lab] if lab != IGNORE_INDEX else "I-ORG" for lab in enc["labels"]] for enc in encoded]
    predictions = task.postprocess(outputs, encoded, raw, names)
    references = task.references(raw, names, "test")
    assert predictions == references and references["0"] == [names[i] for i in raw[0]["ner_tags"]]


def test_words_cut_by_max_length_are_predicted_outside_and_counted(tokenizer, caplog):
    task = TASKS["wikiann"]
    raw = load(task, "validation", "en").select(range(5))
    names = task.resolve_label_names(raw)
    encoded = encode(task, raw, tokenizer, 8, names)
    outputs = [["B-LOC"] * len(ids) for ids in encoded["input_ids"]]
    with caplog.at_level(logging.WARNING, logger="mtft"):
        predictions = task.postprocess(outputs, encoded, raw, names)
    for key, row in zip(predictions, raw):
        assert len(predictions[key]) == len(row["tokens"])
        seen = {w for w in encoded[int(key)]["word_ids"] if w >= 0}
        assert predictions[key] == ["B-LOC" if w in seen else "O" for w in range(len(row["tokens"]))]
    assert "predicted 'O'" in caplog.text


def test_ner_metrics_are_seqeval_entity_f1_in_the_configured_mode():
    task = TASKS["wikiann"]
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "I-ORG", "O"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG"], ["I-ORG", "I-ORG", "O"]]
    # default (CoNLL) mode: "I-ORG I-ORG" is the entity ORG -> 2 of 3 right on both sides
    assert task.compute_metrics(pred, gold) == pytest.approx({"f1": 2 / 3, "precision": 2 / 3, "recall": 2 / 3})
    strict = task.configured({"seqeval_mode": "strict"}, "test")
    # IOB2 strict: an entity cannot start with I-: 1 right of 2 predicted, of 3 gold
    assert strict.compute_metrics(pred, gold) == pytest.approx({"f1": 0.4, "precision": 0.5, "recall": 1 / 3})
    assert "default mode (CoNLL chunking" in task.metric_description()


def test_tag_prediction_checks():
    task, names = TASKS["wikiann"], ["O", "B-PER", "I-PER"]
    assert task.check_prediction(["O", "B-PER"], ["O", "O"], names) is None
    assert "2 tags for 3 words" in task.check_prediction(["O", "O"], ["O"] * 3, names)
    assert "tag 'B-XYZ' is not a label name" in task.check_prediction(["O", "B-XYZ"], ["O", "O"], names)
    assert "list of tags" in task.check_prediction("O O", ["O", "O"], names)


# ----- TyDiQA -----------------------------------------------------------------------------------------------
def test_tydiqa_hub_schema_and_language_from_the_id_prefix():
    task = TASKS["tydiqa"]
    assert type(task).__name__ == "ExtractiveQATask" and task.languages == list(tydiqa_fixture.LANGUAGE_NAMES)
    assert datasets.get_dataset_config_names(SOURCES["google-research-datasets/tydiqa"]) == ["secondary_task"]
    whole = datasets.load_dataset(SOURCES["google-research-datasets/tydiqa"], "secondary_task", split="validation")
    assert whole.column_names == ["id", "title", "context", "question", "answers"]
    assert len(whole) == 9 * 30
    for lang, name in tydiqa_fixture.LANGUAGE_NAMES.items():
        rows = load(task, "validation", lang)
        assert len(rows) == 30 and all(i.startswith(f"{name}-") for i in rows["id"])
    # zero-shot trains on the English rows of the one train split
    ref = task.dataset_ref("train", "en", "zero_shot")
    assert task.training_languages(["en", "sw"], "zero_shot") == ["en"] and ref.name == "secondary_task"


def test_qa_windows_labels_reproduce_the_answer_text(tokenizer):
    task = TASKS["tydiqa"].configured({"doc_stride": 8, "max_question_tokens": 12}, "test")
    raw = load(task, "validation", "en")
    encoded = encode(task, raw, tokenizer, 40)
    assert len(encoded) > len(raw)  # long contexts became several windows
    contexts = dict(zip(raw["id"], raw["context"]))
    answers = dict(zip(raw["id"], (a["text"][0] for a in raw["answers"])))
    windows_with_answer = set()
    for key, (start, end), offsets, ids in zip(
        encoded["id"], encoded["labels"], encoded["offset_mapping"], encoded["input_ids"]
    ):
        assert len(ids) <= 40 and len(offsets) == len(ids)
        if (start, end) == (0, 0):
            continue  # this window does not hold the whole answer: CLS
        windows_with_answer.add(key)
        assert contexts[key][offsets[start][0] : offsets[end][1]].strip() == answers[key]
    assert windows_with_answer == set(raw["id"])
    # consecutive windows of one example overlap by doc_stride tokens of context (the first example that has two:
    # with whole words as tokens, a short context fits one window)
    windowed = next(k for k in encoded["id"] if encoded["id"].count(k) >= 2)
    first = [i for i, k in enumerate(encoded["id"]) if k == windowed]
    a, b = (encoded["offset_mapping"][i] for i in first[:2])
    shared = [o for o in a if o != NOT_CONTEXT and o in [x for x in b if x != NOT_CONTEXT]]
    assert len(shared) == 8


def test_qa_postprocess_maps_the_best_span_back_to_context_text(tokenizer):
    task = TASKS["tydiqa"].configured({"doc_stride": 8, "max_question_tokens": 12}, "test")
    raw = load(task, "validation", "en")
    encoded = encode(task, raw, tokenizer, 40)
    outputs = []  # perfect scores: high at the labelled span, in the windows that hold it
    for (start, end), ids in zip(encoded["labels"], encoded["input_ids"]):
        starts, ends = [0.0] * len(ids), [0.0] * len(ids)
        starts[start] += 10.0 if start else -5.0
        ends[end] += 10.0 if end else -5.0
        outputs.append((starts, ends))
    predictions = task.postprocess(outputs, encoded, raw, [])
    references = task.references(raw, [], "test")
    assert list(predictions) == list(references)
    assert all(predictions[k] == references[k][0] for k in references)
    assert task.compute_metrics([predictions[k] for k in references], list(references.values())) == {
        "exact_match": 1.0,
        "f1": 1.0,
    }
    # the answer's character offsets: the gold ones (answer_start), the prediction's text in its context
    spans = task.answers(outputs, encoded, raw)[1]
    contexts = dict(zip(task.split_ids(raw), raw[task.context_column]))
    gold = dict(zip(task.split_ids(raw), raw[task.label_column]))
    for key, (start, end) in spans.items():
        assert contexts[key][start:end] == predictions[key] and start == gold[key]["answer_start"][0]


def test_qa_answer_spans_leave_out_the_space_a_tokenizer_puts_before_a_word():
    task = TASKS["tydiqa"].configured({}, "test")
    raw = datasets.Dataset.from_dict(
        {"id": ["a", "b"], "context": ["one two  three", "x"], "question": ["q", "q"], "answers": [{}, {}]}
    )
    encoded = {"id": ["a", "b"], "offset_mapping": [[[0, 3], [3, 7], [7, 14]], [NOT_CONTEXT]]}
    outputs = [([0.0, 5.0, 0.0], [0.0, 0.0, 5.0]), ([1.0], [1.0])]  # a: " two  three" (offsets 3..14); b: no span
    assert task.answers(outputs, encoded, raw)[1] == {"a": (4, 14), "b": None}
    assert task.postprocess(outputs, encoded, raw, []) == {"a": "two  three", "b": ""}


def test_n_best_spans_respect_context_order_and_max_answer_length():
    offsets = [NOT_CONTEXT, [0, 3], [4, 7], [8, 11], [12, 15], NOT_CONTEXT]
    starts = [9.0, 1.0, 5.0, 0.0, 0.0, 0.0]
    ends = [9.0, 0.0, 0.0, 1.0, 6.0, 8.0]
    spans = best_spans(starts, ends, offsets, n_best=6, max_answer_length=3)
    assert spans[0] == (11.0, 2, 4)  # CLS and the non-context end are never part of a span
    assert all(s <= e < s + 3 and offsets[s] != NOT_CONTEXT and offsets[e] != NOT_CONTEXT for _, s, e in spans)
    assert best_spans(starts, ends, offsets, n_best=6, max_answer_length=1)[0] == (6.0, 4, 4)
    assert answer_span(offsets, {"answer_start": [4], "text": ["abc efg"]}) == [2, 3]
    assert answer_span(offsets, {"answer_start": [14], "text": ["xyz"]}) == [0, 0]  # runs past the window


def test_squad_v11_rules_max_over_gold_answers():
    task = TASKS["tydiqa"]
    scores = task.compute_metrics(["The cat sat!", "a dog", "blue"], [["cat sat", "dog"], ["the dog"], ["red car"]])
    assert scores == pytest.approx({"exact_match": 2 / 3, "f1": 2 / 3})
    assert "SQuAD v1.1" in task.metric_description()


def test_mismatched_answer_offsets_are_counted_and_dropped_or_fatal(tmp_path, caplog):
    def shift_two(rows):
        rows[3]["answers"]["answer_start"][0] += 1
        rows[7]["answers"]["text"][0] = "nowhere"

    folder = write_tydiqa_copy(tmp_path, shift_two)
    sources = {"google-research-datasets/tydiqa": str(folder)}
    task = TASKS["tydiqa"]
    with caplog.at_level(logging.WARNING, logger="mtft"):
        kept = load(task, "validation", "en", sources)
    assert len(kept) == 28
    assert "2 of 30 row(s) have answers that do not match their context: rows " in caplog.text
    assert "dropped" in caplog.text
    # row numbers are those of the split (the file), with the example ids
    file_rows = (folder / "secondary_task/validation.jsonl").read_text().splitlines()
    reported = re.findall(r"(\d+) \(id (english-[\d-]+)\)", caplog.text)
    assert len(reported) == 2 and all(json.loads(file_rows[int(n)])["id"] == i for n, i in reported)
    strict = task.configured({"offset_mismatch": "fail"}, "test")
    with pytest.raises(
        DataError,
        match=r"split validation from .*tydiqa, language en: task 'tydiqa': 2 of 30 "
        rf"row\(s\).*; row {reported[0][0]}: answer '.*' at \d+ reads '.*' in the context",
    ):
        load(strict, "validation", "en", sources)

    def break_all(rows):
        for row in rows:
            row["answers"]["answer_start"] = [s + 1 for s in row["answers"]["answer_start"]]

    with pytest.raises(DataError, match="30 of 30 row"):
        load(
            task,
            "validation",
            "en",
            {"google-research-datasets/tydiqa": str(write_tydiqa_copy(tmp_path / "b", break_all))},
        )


def test_task_settings_and_metrics_are_checked():
    task = TASKS["tydiqa"]
    with pytest.raises(
        ConfigError, match=r"settings.stride: Extra inputs are not permitted.*valid settings: doc_stride"
    ):
        task.configured({"stride": 3}, "data.tasks (tydiqa)")
    with pytest.raises(ConfigError, match=r"settings.max_answer_length: Input should be greater than or equal to 1"):
        task.configured({"max_answer_length": 0}, "x")
    wide = task.configured({"doc_stride": 100}, "x")
    with pytest.raises(ConfigError, match=r"doc_stride=100 must be below max_length \(64\)"):
        wide.encode_rows(
            {
                "question": ["q"],
                "context": ["c"],
                "answers": [{"text": ["c"], "answer_start": [0]}],
                "id": ["english-1-0"],
            },
            [0],
            _any_tokenizer(),
            64,
            [],
            "x",
        )


def _any_tokenizer():
    return tiny_tokenizer(["alpha beta gamma"] * 5, 100, Path(os.environ["MTFT_CACHE"]))


def test_task_file_metric_must_fit_its_kind(tmp_path):
    folder = tmp_path / "tasks"
    folder.mkdir()
    (folder / "ner.yaml").write_text(
        json.dumps(
            {
                "task": "ner",
                "head": "token_classification",
                "languages": ["en"],
                "text_columns": ["tokens"],
                "label_column": "tags",
                "metrics": ["accuracy"],
                "data": {"train": {"path": "x", "split": "train"}},
            }
        )
    )
    with pytest.raises(
        ConfigError,
        match=r"ner.yaml: metrics \['accuracy'\]: accuracy not computed by a "
        r"token_classification task; valid: f1, precision, recall",
    ):
        discover_tasks([folder])
    (folder / "ner.yaml").write_text(
        json.dumps(
            {"task": "ner", "head": "parsing", "languages": ["en"], "data": {"train": {"path": "x", "split": "train"}}}
        )
    )
    with pytest.raises(
        ConfigError,
        match=r"unknown head 'parsing'; valid choices: candidate_scoring, "
        r"multiple_choice, question_answering, regression, "
        r"sequence_classification, token_classification",
    ):
        discover_tasks([folder])


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_name_valid_tasks_languages_and_settings(path, monkeypatch):
    """Beyond the schema (tests/test_config.py): every task, language and task setting of a shipped config
    resolves, and its splits are the ones --prefetch would cache."""
    from mtft.config import load_config
    from mtft.data.prefetch import dataset_refs

    monkeypatch.chdir(REPO)
    config = load_config(path)
    available = discover_tasks(config.data.task_dirs)
    for selection in config.data.tasks:
        task = available[selection.name].configured(selection.settings, str(path))
        assert set(selection.languages or task.languages) <= set(task.languages)
    assert dataset_refs(config.data, config.evaluation.split)


def test_duplicate_example_ids_stop_a_run_before_training(tmp_path):
    from mtft.config import validate_config
    from tests.helpers.data import prepare_for

    def duplicate(rows):
        rows[5]["id"] = rows[2]["id"]

    folder = write_tydiqa_copy(tmp_path, duplicate)
    config = validate_config(
        {
            "data": {
                "tasks": [{"name": "tydiqa", "languages": ["en"]}],
                "sources": {"google-research-datasets/tydiqa": str(folder)},
            },
            "model": {"tiny": {"vocab_size": 300}},
        },
        source="test",
    )
    with pytest.raises(
        DataError, match=r"split validation from .*, language en: row 5: duplicate example id 'english-"
    ):
        prepare_for(config, lambda texts: _any_tokenizer())
