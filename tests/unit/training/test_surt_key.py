"""SURT's cache key (mtft.training.surt.surt_key): the same settings and text give the same key; a changed task
text, SURT setting, masked-LM setting, backbone or process count gives another; stability.surt on a random tiny
encoder is refused in one line."""

from __future__ import annotations

import pytest

from mtft.config import validate_config
from mtft.core.errors import ConfigError
from mtft.training.surt import surt_key, surt_optimizer

TEXTS = ["The cat sat.", "A dog barked."]


def config(**sections):
    raw = {
        "data": {"tasks": [{"name": "xnli", "languages": ["en"]}]},
        "model": {"backbone": "some/hub-model"},
        "stability": {"surt": {"enabled": True, "tokens": 4096}},
    }
    for name, value in sections.items():
        raw[name] = {**raw.get(name, {}), **value}
    return validate_config(raw, source="test")


def test_same_settings_and_text_give_the_same_key():
    assert surt_key(config(), TEXTS) == surt_key(config(), list(TEXTS))


@pytest.mark.parametrize(
    "texts, sections, world_size",
    [
        (["The cat sat!", "A dog barked."], {}, 1),  # one character of the task text
        (TEXTS[:1], {}, 1),
        (TEXTS, {"stability": {"surt": {"enabled": True, "tokens": 8192}}}, 1),
        (TEXTS, {"stability": {"surt": {"enabled": True, "tokens": 4096, "lr": 1e-5}}}, 1),
        (TEXTS, {"pretrain": {"seed": 1}}, 1),
        (TEXTS, {"pretrain": {"micro_batch_size": 8}}, 1),
        (TEXTS, {"corpus": {"mlm_probability": 0.2}}, 1),
        (TEXTS, {"model": {"backbone": "other/hub-model"}}, 1),
        (TEXTS, {"model": {"backbone": "some/hub-model", "revision": "v2"}}, 1),
        (TEXTS, {}, 2),
    ],
)
def test_what_changes_the_checkpoint_changes_the_key(texts, sections, world_size):
    assert surt_key(config(**sections), texts, world_size) != surt_key(config(), TEXTS)


def test_a_local_backbone_is_keyed_by_its_content(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"weights one")
    local = config(model={"backbone": str(tmp_path)})
    first = surt_key(local, TEXTS)
    (tmp_path / "model.safetensors").write_bytes(b"weights two")
    assert surt_key(local, TEXTS) != first


def test_what_mtft_writes_beside_a_local_backbone_leaves_its_key_alone(tmp_path):
    """The λ_p cache the forgetting monitors add to the folder, the completion marker and pre-training's record (its
    wall-clock seconds) do not change the re-trained checkpoint, so not the key either; a file of the model does."""
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "pretrain.json").write_text('{"seconds": 41.2}')
    local = config(model={"backbone": str(tmp_path)})
    first = surt_key(local, TEXTS)
    (tmp_path / "pretrain.json").write_text('{"seconds": 57.9}')
    (tmp_path / "COMPLETE").write_text("")
    (tmp_path / "lambda_p").mkdir()
    (tmp_path / "lambda_p" / "0123.json").write_text('{"lambda_p": 7.9}')
    assert surt_key(local, TEXTS) == first
    (tmp_path / "tokenizer.json").write_text("{}")
    assert surt_key(local, TEXTS) != first


def test_surt_lr_replaces_the_pretrain_peak_rate_only():
    cfg = config(
        stability={"surt": {"enabled": True, "lr": 2e-5}}, pretrain={"optimizer": {"name": "adamw", "lr": 5e-4}}
    )
    assert surt_optimizer(cfg.pretrain, cfg.stability.surt) == cfg.pretrain.optimizer.model_copy(update={"lr": 2e-5})
    plain = config()
    assert surt_optimizer(plain.pretrain, plain.stability.surt) == plain.pretrain.optimizer


def test_the_key_is_that_of_before_the_optimizer_was_passed_whole():
    """SURT's optimizer reaches the engine directly now (issue 30), no longer through a copy of the pretrain
    section; the cached checkpoints stay valid: the keys are those the copy gave (computed at f8af9df)."""
    assert surt_key(config(stability={"surt": {"enabled": True, "lr": 2e-5}}), TEXTS) == "37a0421815f38c2147f28dc9"
    assert surt_key(config(), TEXTS) == "055fef67ad5de27b1fa38c10"


def test_surt_on_a_random_tiny_encoder_is_refused():
    with pytest.raises(ConfigError, match="stability.surt re-trains a pre-trained backbone, not the random tiny one"):
        config(model={"backbone": "tiny"})
    assert config(model={"backbone": "tiny"}, pretrain={"before_finetune": True}).stability.surt.enabled
