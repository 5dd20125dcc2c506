"""Two processes (torchrun, gloo, ZeRO-2) train exactly like one process holding the whole global batch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from mtft.data.sampler import MultiObjectiveSampler, mixing_probabilities
from tests.conftest import demo_overrides, read_jsonl, run_cli, run_torchrun

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

# Mean absolute difference allowed between the two loss curves: only the order of floating-point sums
# differs (gloo's all-reduce, per-rank padding); measured here ~5e-8 per step.
LOSS_TOLERANCE = 1e-5


def second_task(folder: Path) -> Path:
    """A second task on the XNLI fixtures, so that ranks often hold different task heads in one step."""
    folder.mkdir(parents=True)
    (folder / "nli_copy.yaml").write_text(
        yaml.safe_dump(
            {
                "task": "nli_copy",
                "head": "sequence_classification",
                "languages": ["sw", "ru"],
                "default_protocol": "in_language",
                "text_columns": ["premise", "hypothesis"],
                "metrics": ["accuracy"],
                "data": {
                    "train": {"path": "facebook/xnli", "name": "{language}", "split": "train"},
                    "validation": {"path": "facebook/xnli", "name": "{language}", "split": "validation"},
                },
            }
        )
    )
    return folder


def common(tmp_path: Path, out: Path, micro: int, zero: int, method: str = "multi_lora") -> list[str]:
    tasks = (
        "[{name: xnli, languages: [en, de], protocol: in_language, max_train_examples: 200}, "
        "{name: nli_copy, max_train_examples: 40}]"
    )
    return demo_overrides(
        out,
        16,
        **{
            "training.micro_batch_size": micro,
            "training.deepspeed_config": f"configs/deepspeed/zero{zero}.json",
            "model.dropout": 0.0,
            "model.classifier_dropout": 0.0,
            "logging.every_steps": 1,
            "evaluation.every_steps": 8,
            "checkpointing.every_steps": 8,
            "data.tasks": tasks,
            "data.task_dirs": f"[{tmp_path / 'tasks'}]",
            "data.mixing.strategy": "proportional",
            "weighting.method": "mean",  # the plain loop here; tests/test_lfmlf_e2e.py runs LF-MLF distributed
            "model.adapter.method": method,
            "training.optimizer.lr": 1e-3 if method == "full" else 1e-2,
            "forgetting.enabled": "false",  # monitors need full weights (not ZeRO-3); tests/test_forgetting_e2e.py
        },
    )


def train_losses(out: Path) -> list[float]:
    return [e["loss"] for e in read_jsonl(out / "metrics.jsonl") if e["kind"] == "train"]


@pytest.mark.parametrize("method", ["full", "multi_lora"])
def test_two_process_zero2_matches_single_process(tmp_path, method):
    second_task(tmp_path / "tasks")
    single, double = tmp_path / "single", tmp_path / "double"
    one = run_cli("--config", "configs/demo.yaml", *common(tmp_path, single, micro=16, zero=2, method=method))
    assert one.returncode == 0, one.stderr[-3000:]
    two = run_torchrun("--config", "configs/demo.yaml", *common(tmp_path, double, micro=8, zero=2, method=method))
    assert two.returncode == 0, two.stderr[-5000:]
    a, b = train_losses(single), train_losses(double)
    assert len(a) == len(b) == 16
    assert sum(abs(x - y) for x, y in zip(a, b)) / len(a) < LOSS_TOLERANCE, list(zip(a, b))
    # replay the run's sampler: in some steps a rank holds no row of one task, which must not break ZeRO's
    # collectives (every head runs, on zero rows)
    sizes = [200, 200, 40, 40]  # xnli/en, xnli/de, nli_copy/sw, nli_copy/ru
    sampler = MultiObjectiveSampler(sizes, mixing_probabilities(sizes, "proportional"), 16, seed=7)
    rank_tasks = [
        {u >= 2 for u, _ in half}
        for _ in range(16)
        for batch in [sampler.next_batch()]
        for half in (batch[:8], batch[8:])
    ]
    assert any(len(tasks) == 1 for tasks in rank_tasks)
    events = read_jsonl(double / "metrics.jsonl")
    assert json.loads((double / "metrics.json").read_text())["step"] == 16
    assert "processes | 2" in (double / "report.md").read_text()
    assert {e["kind"] for e in events} == {"train", "eval", "sync"}
    assert all(e["ranks_in_sync"] for e in events if e["kind"] == "sync")
    w1 = load_file(str(single / "checkpoints/step-00000016/model.safetensors"))
    w2 = load_file(str(double / "checkpoints/step-00000016/model.safetensors"))
    assert max((w1[k] - w2[k]).abs().max().item() for k in w1) < 1e-4


@pytest.mark.parametrize("zero", [1, 3])
def test_other_zero_stages_run_and_checkpoint(tmp_path, zero):
    second_task(tmp_path / "tasks")
    out = tmp_path / f"zero{zero}"
    result = run_cli("--config", "configs/demo.yaml", *common(tmp_path, out, micro=16, zero=zero))
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"ZeRO stage {zero}" in (out / "report.md").read_text()
    state = load_file(str(out / "checkpoints/step-00000016/model.safetensors"))
    assert state["heads.nli_copy.out_proj.weight"].shape == (3, 64)  # gathered, not a ZeRO-3 partition
