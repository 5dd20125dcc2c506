"""A fine-tuning run names its backbone's pre-training: pretrain.json read back, summarised, and logged."""

from __future__ import annotations

import json

from mtft.training.pretrain import backbone_log_row, backbone_pretraining, pretraining_summary

META = {
    "tokens_budget": 65536,
    "tokens_seen": 65536,
    "steps": 128,
    "schedule_steps": 128,
    "scheduler": "cosine",
    "lr_after": 0.0,
    "lp": {"en": 3.84},
    "seed": 0,
    "languages": ["en"],
}


def test_a_backbone_of_the_pretraining_stage_is_read_back(tmp_path):
    (tmp_path / "pretrain.json").write_text(json.dumps(META))
    assert backbone_pretraining(str(tmp_path)) == META
    assert backbone_pretraining("xlm-roberta-base") is None  # a Hub id
    assert backbone_pretraining(str(tmp_path / "absent")) is None
    (tmp_path / "pretrain.json").write_text("{not json")
    assert backbone_pretraining(str(tmp_path)) is None


def test_the_summary_says_the_budget_and_whether_the_schedule_ended_there():
    text = pretraining_summary(META)
    assert text.startswith("65,536 tokens of masked-LM pre-training (128 steps")
    assert "the end of its own cosine schedule, learning rate 0 after it" in text
    middle = {**META, "tokens_budget": 16384, "steps": 32, "lr_after": 0.0021}
    assert "an intermediate checkpoint of a 128-step cosine schedule, learning rate 0.0021 there" in (
        pretraining_summary(middle)
    )
    old = {k: v for k, v in META.items() if k not in ("schedule_steps", "lr_after")}  # a cache entry from before
    assert pretraining_summary(old) == "65,536 tokens of masked-LM pre-training (128 steps)"


def test_the_log_row_keeps_the_numbers():
    assert backbone_log_row(META) == {
        "tokens_budget": 65536,
        "tokens_seen": 65536,
        "steps": 128,
        "schedule_steps": 128,
        "lr_after": 0.0,
        "seed": 0,
        "lp/en": 3.84,
    }
