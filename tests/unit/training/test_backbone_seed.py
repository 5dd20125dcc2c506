"""The backbone follows pretrain.seed, fine-tuning follows run.seed: the seeds of a study share one backbone."""

from __future__ import annotations

from mtft.config import load_config
from mtft.training.pretrain import prelude_key
from tests.helpers.launch import REPO

DEMO = REPO / "configs" / "demo.yaml"


def test_pretraining_cache_key_ignores_the_fine_tuning_seed():
    languages = ["en", "de"]
    key = prelude_key(load_config(DEMO, ["run.seed=1"]), languages)
    assert prelude_key(load_config(DEMO, ["run.seed=2"]), languages) == key
    assert prelude_key(load_config(DEMO, ["run.seed=1", "pretrain.seed=3"]), languages) != key


def test_pretraining_cache_key_follows_the_process_count_and_zero_stage():
    """N processes pre-train N times the batch for 1/N of the steps: another checkpoint, another cache entry."""
    languages = ["en", "de"]
    config = load_config(DEMO, [])
    one = prelude_key(config, languages)
    assert prelude_key(config, languages, world_size=1) == one
    assert prelude_key(config, languages, world_size=2) not in (one, prelude_key(config, languages, world_size=4))
    zero2 = load_config(DEMO, [f"training.deepspeed_config={REPO / 'configs/deepspeed/zero2.json'}"])
    assert prelude_key(zero2, languages) != one


def test_tiny_encoder_weights_follow_their_init_seed(tmp_path):
    import torch

    from mtft.models.backbone import build_encoder
    from mtft.models.tokenizer import tiny_tokenizer

    tokenizer = tiny_tokenizer(["a small text", "another small text"] * 20, 64, tmp_path)
    cfg = load_config(DEMO).model

    def weights(init_seed: int) -> torch.Tensor:
        return torch.cat([p.flatten() for p in build_encoder(cfg, tokenizer, 16, init_seed).parameters()])

    assert torch.equal(weights(0), weights(0)) and not torch.equal(weights(0), weights(1))
