"""Run configurations, tokenizers and data copies for the data tests: the XNLI fixtures as sources, a config of
the data section alone, the tiny tokenizer, ``prepare_data`` for a whole run configuration, a copy of a fixture with its
validation split only, and the source/target layout of the zero-shot tests."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from mtft.config import validate_config
from mtft.config.run_config import RunConfig
from mtft.data.pipeline import PreparedData, prepare_data
from mtft.models.tokenizer import tiny_tokenizer
from tests.helpers.launch import REPO

XNLI_SOURCES = {
    "facebook/xnli": str(REPO / "tasks/xnli/fixtures/xnli"),
    "nyu-mll/multi_nli": str(REPO / "tasks/xnli/fixtures/multi_nli"),
}


def make_config(**data) -> object:
    raw = {"data": {"sources": XNLI_SOURCES, **data}, "model": {"tiny": {"vocab_size": 300}}}
    raw["data"].setdefault(
        "tasks",
        [
            {
                "name": "xnli",
                "languages": ["en", "de"],
                "protocol": "in_language",
                "max_train_examples": 40,
                "max_eval_examples": 20,
            }
        ],
    )
    return validate_config(raw, source="test")


def tokenizer_factory(texts):
    import os

    return tiny_tokenizer(texts, 300, Path(os.environ["MTFT_CACHE"]))


def validation_only_copy(fixture: Path, out: Path) -> Path:
    """A copy of the Hub-layout fixture folder ``fixture`` with its validation files only (its README's configs
    list nothing else): evaluation-only data."""
    readme = (fixture / "README.md").read_text()
    (out / "README.md").parent.mkdir(parents=True, exist_ok=True)
    (out / "README.md").write_text(re.sub(r"  - split: (?!validation\n).*\n    path: .*\n", "", readme))
    for file in fixture.glob("*/validation.jsonl"):
        (out / file.parent.name).mkdir()
        shutil.copy(file, out / file.parent.name)
    return out


LANGUAGES, SOURCES, TARGETS = ["en", "de", "ar", "zh"], ["en", "de"], ["ar", "zh"]


XNLI = {
    "name": "xnli",
    "languages": LANGUAGES,
    "source_languages": SOURCES,
    "protocol": "in_language",
    "max_train_examples": 30,
    "max_eval_examples": 10,
}


def prepare_for(
    config: RunConfig,
    make_tokenizer: Callable[[list[str]], Any],
    trained: Optional[Mapping[str, Sequence[str]]] = None,
) -> PreparedData:
    """What a run of ``config`` prepares: its data section, evaluation split and objective grouping."""
    return prepare_data(config.data, config.evaluation.split, config.weighting.objectives, make_tokenizer, trained)
