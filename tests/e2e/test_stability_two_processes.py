"""The stable fine-tuning methods on two processes (torchrun, gloo, ZeRO-2): MHLoss under LF-MLF -- whose
per-objective gradients are then sharded layer by layer, the H heads included -- trains as one process holding the
whole global batch does; MMR (class centres of each rank's micro-batch, as of each micro-batch on one process) and
Mixout (masks each rank draws for itself) keep the ranks' weights identical."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.helpers.launch import run_cli, run_torchrun
from tests.helpers.runs import BASE_CONFIG, base_overrides, read_jsonl

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(600)]
STEPS = 8
TASKS = "[{name: xnli, languages: [en, de], protocol: in_language, max_train_examples: 96, max_eval_examples: 16}]"


def overrides(out: Path, **extra) -> list[str]:
    return base_overrides(
        out,
        STEPS,
        **{
            "data.tasks": TASKS,
            "model.adapter.method": "full",
            "model.classifier_dropout": 0.0,
            "training.optimizer.lr": 1e-3,
            "training.micro_batch_size": 8,
            "training.deepspeed_config": "configs/deepspeed/zero2.json",
            "logging.every_steps": 1,
            "evaluation.every_steps": STEPS,
            "checkpointing.every_steps": STEPS,
            **extra,
        },
    )


def losses(out: Path) -> list[float]:
    return [e["loss"] for e in read_jsonl(out / "metrics.jsonl") if e["kind"] == "train"]


def test_mhloss_under_lfmlf_matches_one_process(tmp_path):
    methods = {"stability.heads": 4, "weighting.method": "lfmlf"}
    one = run_cli("--config", BASE_CONFIG, *overrides(tmp_path / "one", **methods, **{"training.micro_batch_size": 16}))
    assert one.returncode == 0, one.stderr[-3000:]
    two = run_torchrun("--config", BASE_CONFIG, *overrides(tmp_path / "two", **methods))
    assert two.returncode == 0, two.stderr[-5000:]
    a, b = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert len(a) == len(b) == STEPS
    assert max(abs(x - y) for x, y in zip(a, b)) < 1e-5, list(zip(a, b))
    events = [e for e in read_jsonl(tmp_path / "two" / "metrics.jsonl") if e["kind"] == "weighting"]
    assert len(events) == STEPS and all(e["gram_shards"] == 2 for e in events)
    w1 = load_file(str(tmp_path / "one" / f"checkpoints/step-{STEPS:08d}/model.safetensors"))
    w2 = load_file(str(tmp_path / "two" / f"checkpoints/step-{STEPS:08d}/model.safetensors"))
    assert w2["heads.xnli.out_proj.weight"].shape[0] == 4  # the 4 heads, trained through the sharded Gram step
    assert max((w1[k] - w2[k]).abs().max().item() for k in w1) < 1e-3


MIXOUT_MMR = {"stability.mmr": 1.0, "stability.mixout": 0.5, "weighting.method": "mean", "weighting.options": {}}


def test_mmr_and_mixout_on_two_ranks_keep_them_in_sync(tmp_path):
    out = tmp_path / "two"
    result = run_torchrun("--config", BASE_CONFIG, *overrides(out, **MIXOUT_MMR))
    assert result.returncode == 0, result.stderr[-5000:]
    events = read_jsonl(out / "metrics.jsonl")
    assert len(losses(out)) == STEPS
    syncs = [e for e in events if e["kind"] == "sync"]
    assert syncs and all(e["ranks_in_sync"] for e in syncs)
