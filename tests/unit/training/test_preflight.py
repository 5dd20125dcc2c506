"""Mistakes in the task list, the local data files or the backbone's location are refused before the process group,
DeepSpeed, the tokenizer or the model start (mtft.training.preflight)."""

from __future__ import annotations

import pytest
from huggingface_hub import constants

from mtft.config import validate_config
from mtft.core.errors import ConfigError, DataError
from mtft.models.backbone import check_backbone
from mtft.training import pretrain, trainer
from tests.helpers.launch import REPO

SOURCES = {"facebook/xnli": str(REPO / "tasks/xnli/fixtures/xnli")}


def config(tmp_path, **sections):
    raw = {
        "run": {"output_dir": str(tmp_path / "run")},
        "data": {"tasks": [{"name": "xnli", "languages": ["en"], "protocol": "in_language"}], "sources": SOURCES},
        "training": {"deepspeed_config": str(REPO / "configs/deepspeed/zero0.json")},
        "evaluation": {"metric_for_best": None},
    }
    for section, values in sections.items():
        raw.setdefault(section, {}).update(values)
    return validate_config(raw, source="test")


@pytest.fixture
def nothing_heavy(monkeypatch):
    """The process group (and with it DeepSpeed) may not start: preflight must have refused first."""

    def started():
        raise AssertionError("the process group started before the input was checked")

    monkeypatch.setattr(trainer, "init_distributed", started)
    monkeypatch.setattr(pretrain, "init_distributed", started)


def _not_utf8(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "validation"):
        (data / f"{split}.jsonl").write_bytes(b'{"premise": "a", "hypothesis": "b", "label": 0}\n')
    (data / "validation.jsonl").write_bytes(b'{"premise": "\xe9", "hypothesis": "b", "label": 0}\n')
    return {"data": {"sources": {"facebook/xnli": str(data / "{split}.jsonl")}}}


def _bad_corpus(tmp_path, sections):
    corpus = tmp_path / "corpus" / "en"
    corpus.mkdir(parents=True)
    (corpus / "train.jsonl").write_text('{"text": "fine"}\n')
    (corpus / "validation.jsonl").write_bytes(b'{"text": "\xff"}\n')
    return {**sections, "corpus": {"path": str(tmp_path / "corpus"), "languages": ["en"]}}


CASES = {
    "unknown task": (lambda t: {"data": {"tasks": [{"name": "nli"}]}}, ConfigError, "unknown task 'nli'"),
    "unknown language": (
        lambda t: {"data": {"tasks": [{"name": "xnli", "languages": ["en", "xx"]}]}},
        ConfigError,
        r"no language\(s\) xx",
    ),
    "bad task setting": (
        lambda t: {"data": {"tasks": [{"name": "xnli", "settings": {"colour": 1}}]}},
        ConfigError,
        "settings.colour",
    ),
    "metric_for_best": (
        lambda t: {"evaluation": {"metric_for_best": "xnli/f1"}},
        ConfigError,
        "is not a metric of this run",
    ),
    "data file missing": (
        lambda t: {"data": {"sources": {"facebook/xnli": str(t / "none/{split}.jsonl")}}},
        DataError,
        "dataset file not found",
    ),
    "data file not UTF-8": (_not_utf8, DataError, r"validation.jsonl .*not UTF-8 text \(byte 13, line 1\)"),
    "corpus file not UTF-8 (monitors on)": (
        lambda t: _bad_corpus(t, {"forgetting": {"enabled": True}}),
        DataError,
        r"en/validation.jsonl .*not UTF-8 text",
    ),
    "corpus file missing (pre-training first)": (
        lambda t: {"pretrain": {"before_finetune": True}, "corpus": {"path": str(t / "nothing"), "languages": ["en"]}},
        DataError,
        "corpus.path: no such folder",
    ),
    "MHLoss on a token classification task": (
        lambda t: {
            "stability": {"heads": 5},
            "data": {
                "tasks": [
                    {"name": "xnli", "languages": ["en"], "protocol": "in_language"},
                    {"name": "wikiann", "languages": ["en"], "protocol": "in_language"},
                ],
                "sources": {**SOURCES, "unimelb-nlp/wikiann": str(REPO / "tasks/wikiann/fixtures/wikiann")},
            },
        },
        ConfigError,
        r"^stability.heads=5 \(MHLoss\) supports pooled heads only; task 'wikiann' has a token_classification head",
    ),
    "second backward under ZeRO-3": (
        lambda t: {
            "gradients": {"buffers": "none", "update": "backward"},
            "training": {"deepspeed_config": str(REPO / "configs/deepspeed/zero3.json")},
        },
        ConfigError,
        "gradients.update=backward runs a second backward pass .* ZeRO-3 does not gather",
    ),
    "backbone folder missing": (
        lambda t: {"model": {"backbone": str(t / "model")}},
        ConfigError,
        "no such folder",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_refused_before_the_process_group_starts(tmp_path, nothing_heavy, case):
    sections, error, message = CASES[case]
    with pytest.raises(error, match=message):
        trainer.Run(config(tmp_path, **sections(tmp_path))).execute()
    assert not (tmp_path / "run").exists()


def test_pretraining_is_checked_first_too(tmp_path, nothing_heavy):
    corpus = {"languages": ["en"]}
    with pytest.raises(ConfigError, match="no such folder"):
        pretrain.PretrainRun(
            config(tmp_path, run={"stage": "pretrain"}, model={"backbone": "./none"}, corpus=corpus)
        ).execute()
    with pytest.raises(ConfigError, match="cannot resume"):
        pretrain.PretrainRun(config(tmp_path, run={"stage": "pretrain", "resume": True}, corpus=corpus)).execute()


def test_backbone_locations(tmp_path, monkeypatch):
    def check(backbone, revision=None):
        check_backbone(config(tmp_path, model={"backbone": backbone, "revision": revision}).model)

    check("tiny")
    folder = tmp_path / "model"
    folder.mkdir()
    with pytest.raises(ConfigError, match="the folder has no config.json"):
        check(str(folder))
    (folder / "config.json").write_text("{}")
    check(str(folder))
    with pytest.raises(ConfigError, match="is a file"):
        check(str(folder / "config.json"))
    with pytest.raises(ConfigError, match=r"no such folder \(and not a Hub id"):
        check("../models/x")
    # offline, a Hub id must be in the Hugging Face cache: an empty cache, then one holding the model's config
    cache = tmp_path / "hub"
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    with pytest.raises(ConfigError, match="not in the Hugging Face cache while the Hub is offline"):
        check("org/model")
    snapshot = cache / "models--org--model" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (cache / "models--org--model" / "refs").mkdir()
    (cache / "models--org--model" / "refs" / "main").write_text("abc123")
    check("org/model")
    with pytest.raises(ConfigError, match="not in the Hugging Face cache"):
        check("org/model", revision="v2")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    check("org/other")  # online, from_pretrained decides (a check would cost a request)


def test_the_second_backward_is_refused_on_several_processes(tmp_path, nothing_heavy, monkeypatch):
    """gradients.update=backward forms each layer's Gram part before the ranks' products could be summed:
    refused on two processes whenever the bufferless step may be chosen (none, auto), before anything starts."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    for buffers in ("none", "auto"):
        run = trainer.Run(config(tmp_path, gradients={"buffers": buffers, "update": "backward"}))
        with pytest.raises(ConfigError, match=r"runs on one process \(2 launched\).*gradients.update=tape"):
            run.execute()
    assert not (tmp_path / "run").exists()
