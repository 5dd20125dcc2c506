"""What the DeepSpeed engine is built from (mtft.training.engine.EngineSpec, issue 30): each stage passes its own
optimizer, schedule and batch plan, no stand-in config. The masked-LM stage's spec is exactly what the stand-in
``training`` section (pretrain's optimizer copied in, the weighting blanked) gave before, under a Gram weighting
with gradient accumulation too -- the settings the stand-in had to neutralise."""

from __future__ import annotations

from mtft.config import load_config
from mtft.config.schema import WeightingSection
from mtft.training.engine import deepspeed_config, finetuning_engine, masked_lm_engine
from tests.helpers.launch import REPO

OVERRIDES = [
    "weighting.method=lfmlf",
    "training.gradient_accumulation_steps=3",
    "training.deepspeed_config=configs/deepspeed/zero2.json",
    "pretrain.micro_batch_size=8",
    "pretrain.optimizer.lr=3e-4",
    "pretrain.scheduler.name=cosine",
]


def test_the_masked_lm_engine_is_pretrains_own(monkeypatch):
    monkeypatch.chdir(REPO)
    config = load_config(REPO / "tests/e2e/base.yaml", OVERRIDES)
    spec = masked_lm_engine(config, config.pretrain.optimizer, steps=40, world_size=2)
    assert (spec.optimizer.lr, spec.scheduler.name, spec.max_steps) == (3e-4, "cosine", 40)
    ds = spec.deepspeed
    # one micro-batch of pretrain's per step: no Gram step folding, no accumulation of the fine-tuning run's
    assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"], ds["train_batch_size"]) == (
        8,
        1,
        16,
    )
    stand_in = config.model_copy(
        update={
            "training": config.training.model_copy(
                update={"micro_batch_size": 8, "gradient_accumulation_steps": 1, "max_steps": 40}
            ),
            "weighting": WeightingSection(),
        }
    )
    assert ds == deepspeed_config(stand_in, 2)  # the DeepSpeed JSON the stand-in config gave


def test_the_finetuning_engine_folds_the_gram_steps_micro_batches(monkeypatch):
    monkeypatch.chdir(REPO)
    config = load_config(REPO / "tests/e2e/base.yaml", OVERRIDES)
    spec = finetuning_engine(config, world_size=2)
    assert spec.optimizer == config.training.optimizer and spec.max_steps == config.training.max_steps
    micro = config.training.micro_batch_size
    assert (spec.deepspeed["train_micro_batch_size_per_gpu"], spec.deepspeed["gradient_accumulation_steps"]) == (
        3 * micro,
        1,
    )
