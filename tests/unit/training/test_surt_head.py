"""SURT on a backbone without a masked-LM head (all-MiniLM-L6-v2's layout) is refused in one line before any
training; one with a head is re-trained from its own head. The re-training blocks come from the given texts only."""

from __future__ import annotations

import pytest

from mtft.config import validate_config
from mtft.core.distributed import ProcessInfo
from mtft.core.errors import ConfigError
from mtft.training.pretrain import Pretraining
from tests.helpers.tiny_bert import corpus_lines, tiny_bert, wordpiece_tokenizer

TEXTS = ["the cat sat on the mat and looked at the dog"] * 40


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return wordpiece_tokenizer(tmp_path_factory.mktemp("vocab"), corpus_lines("en"))


def retraining(backbone, tmp_path) -> Pretraining:
    config = validate_config(
        {
            "model": {"backbone": str(backbone)},
            "data": {"tasks": [{"name": "xnli"}], "max_length": 16, "cache_dir": str(tmp_path / "cache")},
            "pretrain": {"micro_batch_size": 4},
            "stability": {"surt": {"enabled": True, "tokens": 64}},
        },
        source="test",
    )
    return Pretraining(config, [], ProcessInfo(0, 1, 0), training_texts=TEXTS)


def test_a_backbone_without_a_masked_lm_head_is_refused(tmp_path, tokenizer):
    pre = retraining(tiny_bert(tmp_path / "bare", tokenizer), tmp_path)
    with pytest.raises(ConfigError, match=r"stability.surt: model.backbone=.*has no masked-LM head to re-train with"):
        pre.new_model()


def test_a_backbone_with_its_head_is_retrained_on_the_given_texts_only(tmp_path, tokenizer):
    pre = retraining(tiny_bert(tmp_path / "mlm", tokenizer, masked_lm=True), tmp_path)
    assert pre.new_model().config.model_type == "bert"
    assert pre.eval_set is None and pre.evaluate(None) == {}  # no corpus is read
    stream = [i for ids in tokenizer(TEXTS)["input_ids"] for i in ids]
    assert pre.blocks == [stream[i : i + 16] for i in range(0, len(stream) - 15, 16)]
