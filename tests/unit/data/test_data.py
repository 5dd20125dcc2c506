"""Data plumbing: sources (Hub layout and file patterns), checks, tokenisation and its cache, task discovery."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import datasets
import pytest

from mtft.config import validate_config
from mtft.core.errors import ConfigError, DataError
from mtft.data.sources import load_split
from mtft.models.tokenizer import tiny_tokenizer
from mtft.tasks import DatasetRef, discover_tasks
from tests.helpers.data import XNLI_SOURCES, make_config, prepare_for, tokenizer_factory
from tests.helpers.launch import REPO


def test_hub_layout_folder_keeps_configs_and_classlabels():
    ref = DatasetRef(path="facebook/xnli", name="sw", split="validation")
    dataset = load_split(ref, XNLI_SOURCES)
    assert isinstance(dataset.features["label"], datasets.ClassLabel)
    assert dataset.features["label"].names == ["entailment", "neutral", "contradiction"]
    assert dataset.column_names == ["premise", "hypothesis", "label"] and len(dataset) == 150
    mnli = load_split(DatasetRef(path="nyu-mll/multi_nli", split="validation_matched"), XNLI_SOURCES)
    assert {"promptID", "pairID", "genre"} <= set(mnli.column_names)


def test_hub_id_without_network_fails_fast_and_clearly():
    start = time.perf_counter()
    with pytest.raises(DataError, match=r"cannot load facebook/xnli \(config de\) split test: .*data.sources"):
        load_split(DatasetRef(path="facebook/xnli", name="de", split="test"))
    assert time.perf_counter() - start < 15


def test_zero_shot_trains_on_multinli_and_evaluates_every_language():
    config = make_config(
        tasks=[
            {
                "name": "xnli",
                "languages": ["en", "de", "zh"],
                "protocol": "zero_shot",
                "max_train_examples": 30,
                "max_eval_examples": 10,
            }
        ]
    )
    data = prepare_for(config, tokenizer_factory)
    assert [o.key for o in data.train_units] == ["xnli/en"]
    assert "nyu-mll/multi_nli" in data.tasks["xnli"].origin["train", "en"]
    assert [o.key for o in data.eval_objectives()] == ["xnli/en", "xnli/de", "xnli/zh"]


def test_in_language_rows_are_tokenised_with_labels_and_ids():
    data = prepare_for(make_config(), tokenizer_factory)
    assert [o.key for o in data.train_units] == ["xnli/en", "xnli/de"]
    train = data.tasks["xnli"].train["de"]
    assert len(train) == 40 and set(train.column_names) >= {"input_ids", "attention_mask", "labels", "id"}
    raw = data.tasks["xnli"].raw_train["de"]
    assert train["labels"] == raw["label"]
    assert train["id"][:3] == ["0", "1", "2"]
    first = data.tokenizer.decode(train[0]["input_ids"], skip_special_tokens=True)
    assert first.replace(" ", "") == (raw[0]["premise"] + raw[0]["hypothesis"]).replace(" ", "")


@pytest.mark.parametrize(
    "mode, names", [("task_language", ["xnli/en", "xnli/de"]), ("task", ["xnli"]), ("language", ["en", "de"])]
)
def test_objective_grouping(mode, names):
    config = make_config()
    config.weighting.objectives = mode
    data = prepare_for(config, tokenizer_factory)
    assert data.objective_names == names
    assert [names[i] for i in data.unit_objective] == [
        {"task_language": u.key, "task": u.task, "language": u.language}[mode] for u in data.train_units
    ]


def test_tokenisation_is_cached(monkeypatch):
    config = make_config()
    first = prepare_for(config, tokenizer_factory)
    calls = []
    from mtft.tasks.base import Task

    original = Task.encode
    monkeypatch.setattr(Task, "encode", lambda self, *a: calls.append(1) or original(self, *a))
    second = prepare_for(config, tokenizer_factory)
    assert calls == []  # every split came from the datasets cache
    assert second.tasks["xnli"].train["en"]["input_ids"] == first.tasks["xnli"].train["en"]["input_ids"]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def user_task(folder: Path, **overrides) -> Path:
    """A declarative task in a user folder, reading local JSON-lines files with string labels."""
    spec = {
        "task": "sentiment",
        "head": "sequence_classification",
        "languages": ["en", "fr"],
        "default_protocol": "in_language",
        "text_columns": ["text"],
        "label_column": "label",
        "label_names": ["neg", "pos"],
        "metrics": ["accuracy"],
        "data": {
            "train": {"path": "my/sentiment", "name": "{language}", "split": "train"},
            "validation": {"path": "my/sentiment", "name": "{language}", "split": "validation"},
        },
        **overrides,
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sentiment.yaml").write_text(json.dumps(spec))  # JSON is YAML
    return folder


def sentiment_rows(n: int) -> list[dict]:
    return [
        {"text": f"{'good great' if i % 2 else 'bad awful'} thing {i}", "label": "pos" if i % 2 else "neg"}
        for i in range(n)
    ]


def sentiment_config(tmp_path: Path, pattern: str):
    raw = {
        "data": {
            "tasks": [{"name": "sentiment"}],
            "task_dirs": [str(tmp_path / "tasks")],
            "sources": {"my/sentiment": pattern},
        },
        "model": {"tiny": {"vocab_size": 100}},
    }
    return validate_config(raw, source="test")


def test_user_task_folder_and_local_file_pattern(tmp_path):
    user_task(tmp_path / "tasks")
    for lang in ("en", "fr"):
        for split in ("train", "validation"):
            write_jsonl(tmp_path / "data" / f"{lang}-{split}.jsonl", sentiment_rows(12))
    data = prepare_for(sentiment_config(tmp_path, str(tmp_path / "data/{name}-{split}.jsonl")), tokenizer_factory)
    assert "sentiment" in discover_tasks([tmp_path / "tasks"])
    assert data.tasks["sentiment"].label_names == ["neg", "pos"]
    assert data.tasks["sentiment"].train["fr"]["labels"][:4] == [0, 1, 0, 1]


def test_edited_local_file_is_reloaded(tmp_path):
    user_task(tmp_path / "tasks")
    for lang in ("en", "fr"):
        for split in ("train", "validation"):
            write_jsonl(tmp_path / "data" / f"{lang}-{split}.jsonl", sentiment_rows(12))
    config = sentiment_config(tmp_path, str(tmp_path / "data/{name}-{split}.jsonl"))
    assert len(prepare_for(config, tokenizer_factory).tasks["sentiment"].train["en"]) == 12
    write_jsonl(tmp_path / "data" / "en-train.jsonl", sentiment_rows(7))
    assert len(prepare_for(config, tokenizer_factory).tasks["sentiment"].train["en"]) == 7


@pytest.mark.parametrize(
    "rows, message",
    [
        (
            [{"text": "a", "label": "pos"}, {"text": "b", "label": "meh"}],
            r"row 1: label 'meh' is out of range; valid labels: 0=neg, 1=pos",
        ),
        ([{"text": "a", "label": 0}, {"text": "b", "label": 5}], r"row 1: label 5 is out of range"),
        ([{"text": "a", "label": "pos"}, {"label": "neg"}], r"row 1: missing value in column 'text'"),
        ([{"txt": "a", "label": "pos"}], r"missing column\(s\) text needed by task 'sentiment'"),
    ],
)
def test_bad_rows_are_refused_with_file_and_row(tmp_path, rows, message):
    user_task(tmp_path / "tasks")
    for lang in ("en", "fr"):
        write_jsonl(tmp_path / "data" / f"{lang}-train.jsonl", rows)
        write_jsonl(tmp_path / "data" / f"{lang}-validation.jsonl", sentiment_rows(4))
    with pytest.raises(DataError, match=message) as info:
        prepare_for(sentiment_config(tmp_path, str(tmp_path / "data/{name}-{split}.jsonl")), tokenizer_factory)
    assert "en-train.jsonl" in str(info.value)


def test_missing_dataset_file(tmp_path):
    user_task(tmp_path / "tasks")
    with pytest.raises(DataError, match=r"dataset file not found: .*en-train.jsonl"):
        prepare_for(sentiment_config(tmp_path, str(tmp_path / "data/{name}-{split}.jsonl")), tokenizer_factory)


def test_unknown_task_language_and_protocol():
    with pytest.raises(ConfigError, match=r"unknown task 'xnlii'; available tasks: .*xnli"):
        prepare_for(make_config(tasks=[{"name": "xnlii"}]), tokenizer_factory)
    with pytest.raises(ConfigError, match=r"task 'xnli' has no language\(s\) xx; valid: ar, bg"):
        prepare_for(make_config(tasks=[{"name": "xnli", "languages": ["en", "xx"]}]), tokenizer_factory)
    with pytest.raises(ConfigError, match="task folder not found"):
        prepare_for(make_config(task_dirs=["/nonexistent/tasks"]), tokenizer_factory)


def test_task_file_errors(tmp_path):
    user_task(tmp_path / "tasks", colour="blue")
    with pytest.raises(ConfigError, match=r"unknown key\(s\) colour"):
        discover_tasks([tmp_path / "tasks"])


def test_python_task_class(tmp_path):
    folder = tmp_path / "tasks"
    user_task(folder, **{"class": "custom:ShoutingTask"})
    (folder / "custom.py").write_text(
        "from mtft.tasks import Task\n\n"
        "class ShoutingTask(Task):\n"
        "    def encode(self, batch, tokenizer, max_length):\n"
        "        return tokenizer([t.upper() for t in batch['text']], truncation=True, max_length=max_length)\n"
    )
    task = discover_tasks([folder])["sentiment"]
    assert type(task).__name__ == "ShoutingTask" and task.label_names == ["neg", "pos"]


def test_tiny_tokenizer_offsets_word_ids_and_cache(tmp_path):
    texts = ["goboba simapo fenule", "上手口鸟 上车", "नेलो सावे चेचु"] * 20
    tok = tiny_tokenizer(texts, 200, tmp_path)
    assert tok.is_fast and tok.pad_token_id == 1 and tok.mask_token_id == 4
    enc = tok("goboba simapo", "上手口鸟", return_offsets_mapping=True)
    text = "goboba simapo"
    spans = [span for span, seq in zip(enc["offset_mapping"], enc.sequence_ids()) if seq == 0]
    covered = {i for a, b in spans for i in range(a, b)}
    # offsets point into the original text and cover every character of every word
    assert {i for i, ch in enumerate(text) if ch != " "} <= covered <= set(range(len(text)))
    assert [a for a, _ in spans] == sorted(a for a, _ in spans)
    words = tok(["goboba", "simapo", "fenule"], is_split_into_words=True).word_ids()
    assert words[0] is None and words[-1] is None and sorted(set(words[1:-1])) == [0, 1, 2]
    folders = list((tmp_path / "tokenizers").iterdir())
    again = tiny_tokenizer(texts, 200, tmp_path)
    assert list((tmp_path / "tokenizers").iterdir()) == folders
    assert again.get_vocab() == tok.get_vocab()


def test_tiny_tokenizer_never_makes_a_piece_of_several_characters_of_a_script_without_spaces(tmp_path):
    """A sentence of Chinese, Japanese kana, Thai or Myanmar is one whitespace pre-token; on recurring sentences BPE
    would merge it into one piece, which teaches a masked-LM nothing. Each of their characters is a pre-token (mBERT's
    treatment of CJK), so they stay pieces of one character, with offsets onto the text; spaced words still merge."""
    unspaced = ["大地羊口大书火风", "きなりちするとたもろ", "ยาราขูพเยีต", "ထီဆေလူ"]
    tok = tiny_tokenizer(unspaced * 50 + ["goboba simapo fenule"] * 50, 300, tmp_path)
    for text in unspaced:
        enc = tok(text, return_offsets_mapping=True, add_special_tokens=False)
        pieces = [p.lstrip("▁") for p in tok.convert_ids_to_tokens(enc["input_ids"])]
        assert all(len(p) <= 1 for p in pieces) and "".join(pieces) == text, pieces
        assert "".join(text[a:b] for (a, b), p in zip(enc["offset_mapping"], pieces) if p) == text
        assert tok.decode(enc["input_ids"]) == text
    assert tok.convert_ids_to_tokens(tok("goboba simapo", add_special_tokens=False)["input_ids"]) == [
        "▁goboba",
        "▁simapo",
    ]


def test_fixtures_are_what_the_generator_writes():
    result = subprocess.run(
        [sys.executable, "-m", "mtft.fixtures", "--check"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("suffix", ["csv", "parquet", "json"])
def test_csv_parquet_and_json_files_load_through_the_same_path(tmp_path, suffix):
    import pandas as pd

    user_task(tmp_path / "tasks")
    for lang in ("en", "fr"):
        for split in ("train", "validation"):
            frame = pd.DataFrame(sentiment_rows(10))
            path = tmp_path / "data" / f"{lang}-{split}.{suffix}"
            path.parent.mkdir(parents=True, exist_ok=True)
            if suffix == "csv":
                frame.to_csv(path, index=False)
            elif suffix == "parquet":
                frame.to_parquet(path)
            else:
                frame.to_json(path, orient="records")
    data = prepare_for(
        sentiment_config(tmp_path, str(tmp_path / f"data/{{name}}-{{split}}.{suffix}")), tokenizer_factory
    )
    assert data.tasks["sentiment"].train["en"]["labels"] == [0, 1] * 5


def test_non_utf8_data_file_is_refused_naming_file_byte_and_line(tmp_path):
    """Arrow's JSON reader loads invalid UTF-8 without a word (the row fails only when read back); mtft refuses the
    file before handing it over."""
    user_task(tmp_path / "tasks")
    for lang in ("en", "fr"):
        for split in ("train", "validation"):
            write_jsonl(tmp_path / "data" / f"{lang}-{split}.jsonl", sentiment_rows(4))
    bad = tmp_path / "data" / "fr-validation.jsonl"
    bad.write_bytes(bad.read_bytes() + b'{"text": "caf\xe9", "label": "pos"}\n')  # Latin-1, not UTF-8
    assert len(datasets.load_dataset("json", data_files=str(bad), split="train")) == 5  # accepted as it is
    config = sentiment_config(tmp_path, str(tmp_path / "data/{name}-{split}.jsonl"))
    line5 = len(b"".join(bad.read_bytes().splitlines(keepends=True)[:4])) + len('{"text": "caf')
    with pytest.raises(DataError, match=rf"fr-validation.jsonl .*: not UTF-8 text \(byte {line5}, line 5\)$"):
        prepare_for(config, tokenizer_factory)


def test_empty_data_file_and_non_utf8_file_of_a_hub_layout_folder(tmp_path):
    from mtft.data.sources import check_local_files

    (tmp_path / "empty.jsonl").write_bytes(b"")
    with pytest.raises(DataError, match=r"empty.jsonl \(for x split train\): the file is empty"):
        check_local_files(DatasetRef(path="x", split="train"), {"x": str(tmp_path / "empty.jsonl")})
    folder = tmp_path / "hub"
    (folder / "en").mkdir(parents=True)
    (folder / "README.md").write_text("---\n---\n")
    (folder / "en" / "train.jsonl").write_bytes(b'{"text": "ok"}\n{"text": "\xff"}\n')
    with pytest.raises(DataError, match=r"en/train.jsonl \(for x \(config en\) split train\): not UTF-8 .*line 2"):
        check_local_files(DatasetRef(path="x", name="en", split="train"), {"x": str(folder)})
