"""Gram weightings under ZeRO-3: the DeepSpeed config is built for them (the Gram step gathers what it needs,
mtft/training/gram_step.py), and only the optimizer-metric Gram, which reads AdamW's ZeRO-1/2 state layout, is
refused in one line."""

from __future__ import annotations

import pytest

from mtft.config import load_config
from mtft.core.errors import ConfigError
from mtft.training.engine import deepspeed_config
from tests.helpers.launch import REPO

ZERO3 = "training.deepspeed_config=configs/deepspeed/zero3.json"


def zero3_config(*overrides: str):
    return load_config(REPO / "tests/e2e/base.yaml", [ZERO3, "training.gradient_accumulation_steps=2", *overrides])


@pytest.mark.parametrize(
    "overrides",
    [
        ["weighting.method=lfmlf"],
        ["weighting.method=pcgrad"],
        ["weighting.method=mean", "gradients.descent_check=true"],
    ],
)
def test_per_objective_gradients_are_accepted_under_zero3(monkeypatch, overrides):
    monkeypatch.chdir(REPO)
    ds = deepspeed_config(zero3_config(*overrides), world_size=2)
    assert ds["zero_optimization"]["stage"] == 3
    # the Gram step accumulates the micro-batches itself and hands DeepSpeed one combined gradient
    assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == (64, 1)


def test_the_optimizer_metric_is_refused_under_zero3(monkeypatch):
    monkeypatch.chdir(REPO)
    config = zero3_config("weighting.method=lfmlf", "gradients.metric=optimizer")
    with pytest.raises(ConfigError, match=r"gradients.metric=optimizer .* ZeRO stage 0, 1 or 2 \(not 3") as error:
        deepspeed_config(config, world_size=2)
    assert "\n" not in str(error.value)
    config.training.deepspeed_config = "configs/deepspeed/zero2.json"
    assert deepspeed_config(config, world_size=2)["zero_optimization"]["stage"] == 2


def test_checkpointing_of_the_per_objective_pass_is_accepted_under_zero3(monkeypatch):
    """The per-objective pass with activation checkpointing runs on the gathered model under ZeRO-3
    (mtft/training/gram_step.py: ``_unpartitioned``; run in tests/e2e/test_zero3_lfmlf.py)."""
    monkeypatch.chdir(REPO)
    for method in ("lfmlf", "mean"):
        config = zero3_config(f"weighting.method={method}", "training.gradient_checkpointing=true")
        assert deepspeed_config(config, world_size=1)["zero_optimization"]["stage"] == 3
