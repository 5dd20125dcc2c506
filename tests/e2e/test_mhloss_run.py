"""MHLoss (stability.heads=5) end to end: a short run over a classification, a regression and a multiple-choice
task trains and evaluates; its training checkpoints keep the 5 heads, while best/ and ``run.py export`` hold one
ordinary head per task, the mean of the 5; a run killed after a checkpoint and resumed ends with the same 5 heads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mtft.training.restore import load_run
from tests.helpers.launch import run_cli, run_script
from tests.helpers.runs import BASE_CONFIG, base_overrides

HEADS = 5
TASKS = {"xnli": 3, "glue_stsb": 1, "superglue_copa": 1}  # task: outputs of its out_proj


OVERRIDES = {
    "stability.heads": HEADS,
    "weighting.method": "mean",
    "weighting.options": {},
    "model.adapter.method": "lora",
    "training.optimizer.lr": 1e-2,
    "data.tasks": "[{name: xnli, languages: [en], protocol: in_language, max_train_examples: 64, "
    "max_eval_examples: 16}, {name: glue_stsb, max_train_examples: 32, max_eval_examples: 16}, "
    "{name: superglue_copa, max_train_examples: 32, max_eval_examples: 16}]",
    "data.sources": {
        "facebook/xnli": "tasks/xnli/fixtures/xnli",
        "nyu-mll/glue": "tasks/glue/fixtures/glue",
        "aps/super_glue": "tasks/super_glue/fixtures/super_glue",
    },
    "evaluation.every_steps": 4,
    "checkpointing.every_steps": 4,  # with keep_last 2: both evaluated steps stay
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("mhloss") / "run"
    result = run_cli("--config", BASE_CONFIG, *base_overrides(out, 8, **OVERRIDES))
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_mhloss_run_trains_evaluates_and_ships_the_averaged_head(trained, tmp_path):
    out = trained
    metrics = json.loads((out / "metrics.json").read_text())
    assert {"xnli/en/accuracy", "glue_stsb/en/pearson", "superglue_copa/accuracy"} <= set(metrics), metrics

    checkpoint = load_file(str(out / "checkpoints/step-00000008/model.safetensors"))
    best = load_file(str(out / "best/model.safetensors"))
    best_step = json.loads((out / "best/metrics.json").read_text())["step"]
    at_best = load_file(str(out / f"checkpoints/step-{best_step:08d}/model.safetensors"))
    for task, outputs in TASKS.items():
        key = f"heads.{task}.out_proj.weight"
        assert checkpoint[key].shape == (HEADS, outputs, 64)  # every head, for an exact resume
        assert best[key].shape == (outputs, 64) and best[f"heads.{task}.out_proj.bias"].shape == (outputs,)
        stacked = checkpoint[key]
        assert not torch.allclose(stacked[0], stacked[1])  # the heads were trained apart
        assert torch.allclose(best[key], at_best[key].mean(0))

    # a training checkpoint loads as a one-head model predicting with the averaged head
    run = load_run(out)
    assert torch.allclose(run.model.heads["xnli"].out_proj.weight, checkpoint["heads.xnli.out_proj.weight"].mean(0))

    exported = tmp_path / "exported"
    result = run_cli("export", "--run", str(out), "--out", str(exported))
    assert result.returncode == 0, result.stderr[-3000:]
    for task, outputs in TASKS.items():
        head = load_file(str(exported / task / "head.safetensors"))
        weights = checkpoint[f"heads.{task}.out_proj.weight"]
        assert head["out_proj.weight"].shape == (outputs, 64)
        assert torch.allclose(head["out_proj.weight"], weights.mean(0))
        assert torch.allclose(head["out_proj.bias"], checkpoint[f"heads.{task}.out_proj.bias"].mean(0))


def test_a_resumed_mhloss_run_ends_with_the_uninterrupted_runs_heads(trained, tmp_path):
    out = tmp_path / "run"
    killed = run_script(
        "tests/helpers/kill_during_run.py",
        "after",
        "4",
        "--config",
        BASE_CONFIG,
        *base_overrides(out, 8, **OVERRIDES),
    )
    assert killed.returncode == -9, killed.stderr[-3000:]
    resumed = run_cli("--config", BASE_CONFIG, *base_overrides(out, 8, **OVERRIDES), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {out}/checkpoints/step-00000004 at step 4" in resumed.stderr
    expected = load_file(str(trained / "checkpoints/step-00000008/model.safetensors"))
    got = load_file(str(out / "checkpoints/step-00000008/model.safetensors"))
    assert expected.keys() == got.keys()
    for key in expected:
        assert torch.equal(expected[key], got[key]), key
    assert got["heads.xnli.out_proj.weight"].shape == (HEADS, 3, 64)
