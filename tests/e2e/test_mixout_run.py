"""Mixout (stability.mixout) in a run: it trains, changes the training (against the same run with p = 0),
writes checkpoints with exactly the keys of a plain run (θ_p is not saved), resumes after SIGKILL to the
uninterrupted run's weights bit for bit (θ_p rebuilt, the mask's random state restored), and restores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mtft.training.restore import load_run
from tests.helpers.launch import run_cli, run_script
from tests.helpers.runs import BASE_CONFIG, base_overrides

STEPS = 6
MIXOUT = {
    "stability.mixout": 0.1,
    "weighting.method": "mean",
    "weighting.options": {},
    "data.tasks.0.languages": "[en,de]",
    "checkpointing.every_steps": 3,
    "evaluation.every_steps": 3,
    "logging.every_steps": 3,
}


def weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out / f"checkpoints/step-{STEPS:08d}/model.safetensors"))


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("mixout") / "run"
    result = run_cli("--config", BASE_CONFIG, *base_overrides(out, STEPS, **MIXOUT))
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_mixout_trains_and_checkpoints_like_a_plain_run(straight, tmp_path):
    metrics = json.loads((straight / "metrics.json").read_text())
    assert metrics["step"] == STEPS and 0.0 <= metrics["xnli/accuracy"] <= 1.0
    plain = tmp_path / "plain"
    result = run_cli("--config", BASE_CONFIG, *base_overrides(plain, STEPS, **{**MIXOUT, "stability.mixout": 0.0}))
    assert result.returncode == 0, result.stderr[-3000:]
    mixed, unmixed = weights(straight), weights(plain)
    assert mixed.keys() == unmixed.keys()  # no θ_p buffer in the checkpoint
    assert not all(torch.equal(mixed[k], unmixed[k]) for k in mixed)  # Mixout changed the training
    # the heads start from the same seed in both runs; the encoder's query weights moved differently
    key = next(k for k in mixed if k.endswith("attention.self.query.weight"))
    assert not torch.equal(mixed[key], unmixed[key])
    restored = load_run(straight)  # strict: a missing or unexpected key would be a CheckpointError
    state = restored.model.state_dict()
    assert all(torch.equal(state[k], mixed[k]) for k in mixed)


def test_mixout_run_resumes_to_the_uninterrupted_weights(straight, tmp_path):
    out = tmp_path / "run"
    args = ["--config", BASE_CONFIG, *base_overrides(out, STEPS, **MIXOUT)]
    killed = run_script("tests/helpers/kill_during_run.py", "after", "3", *args)
    assert killed.returncode == -9, killed.stderr[-3000:]
    resumed = run_cli(*args, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {out}/checkpoints/step-00000003 at step 3" in resumed.stderr
    expected, got = weights(straight), weights(out)
    assert expected.keys() == got.keys()
    for key in expected:
        assert torch.equal(expected[key], got[key]), key
