"""Two processes (torchrun, gloo, ZeRO-2) train exactly like one process holding the whole global batch."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from mtft.data.sampler import MultiObjectiveSampler, mixing_probabilities
from tests.helpers.launch import clean_env, run_cli, run_process, run_torchrun
from tests.helpers.runs import BASE_CONFIG, base_overrides, read_jsonl, second_task

# a hang (a rank stuck in a collective) fails the test: one test here runs at most 2 short runs, ~1-2 minutes
pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(600)]

# Mean absolute difference allowed between the two loss curves: only the order of floating-point sums
# differs (gloo's all-reduce, per-rank padding); measured on the base's random encoder 3.1e-8 (full) and 1.8e-8
# (Multi-LoRA) per step (the weights after 16 steps: at most 7.6e-6 and 5.0e-7 apart).
LOSS_TOLERANCE = 1e-5


def common(tmp_path: Path, out: Path, micro: int, zero: int, method: str = "multi_lora") -> list[str]:
    tasks = (
        "[{name: xnli, languages: [en, de], protocol: in_language, max_train_examples: 200}, "
        "{name: nli_copy, max_train_examples: 40}]"
    )
    # the base's random encoder (no pre-training) and no forgetting monitors (test_forgetting_run.py runs them on two
    # processes, under ZeRO-2 and ZeRO-3)
    return base_overrides(
        out,
        16,
        **{
            "training.micro_batch_size": micro,
            "training.deepspeed_config": f"configs/deepspeed/zero{zero}.json",
            "model.classifier_dropout": 0.0,
            "logging.every_steps": 1,
            "evaluation.every_steps": 8,
            "checkpointing.every_steps": 8,
            "data.tasks": tasks,
            "data.task_dirs": f"[{tmp_path / 'tasks'}]",
            "data.mixing.strategy": "proportional",
            "weighting.method": "mean",  # the plain loop here; test_lfmlf_run.py runs LF-MLF distributed
            "model.adapter.method": method,
            "training.optimizer.lr": 1e-3 if method == "full" else 1e-2,
        },
    )


def train_losses(out: Path) -> list[float]:
    return [e["loss"] for e in read_jsonl(out / "metrics.jsonl") if e["kind"] == "train"]


@pytest.mark.parametrize("method", ["full", "multi_lora"])
def test_two_process_zero2_matches_single_process(tmp_path, method):
    second_task(tmp_path / "tasks")
    single, double = tmp_path / "single", tmp_path / "double"
    one = run_cli("--config", BASE_CONFIG, *common(tmp_path, single, micro=16, zero=2, method=method))
    assert one.returncode == 0, one.stderr[-3000:]
    two = run_torchrun("--config", BASE_CONFIG, *common(tmp_path, double, micro=8, zero=2, method=method))
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
    result = run_cli("--config", BASE_CONFIG, *common(tmp_path, out, micro=16, zero=zero))
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"ZeRO stage {zero}" in (out / "report.md").read_text()
    state = load_file(str(out / "checkpoints/step-00000016/model.safetensors"))
    assert state["heads.nli_copy.out_proj.weight"].shape == (3, 64)  # gathered, not a ZeRO-3 partition


def test_two_process_zero3_evaluation_is_sharded_and_completes(tmp_path):
    """Under ZeRO-3 a forward pass is a collective: the sharded evaluation runs as many on each rank, padding the
    rank left short, so a batch count that two ranks cannot split evenly (150 rows in 64-row batches: 3 per
    objective) does not hang; both ranks score the same gathered rows, so they select the same best/ (a collective
    gather of the weights under ZeRO-3) and the predictions cover every example in the split's order."""
    second_task(tmp_path / "tasks")
    out = tmp_path / "zero3"
    two = run_torchrun("--config", BASE_CONFIG, *common(tmp_path, out, micro=8, zero=3), "evaluation.batch_size=64")
    assert two.returncode == 0, two.stderr[-5000:]
    evaluations = [e for e in read_jsonl(out / "metrics.jsonl") if e["kind"] == "eval"]
    assert [e["step"] for e in evaluations] == [8, 16]
    objectives = [("xnli", "en"), ("xnli", "de"), ("nli_copy", "sw"), ("nli_copy", "ru")]
    assert all(0 <= e[f"{task}/{lang}/accuracy"] <= 1 for e in evaluations for task, lang in objectives)
    assert json.loads((out / "best/metrics.json").read_text())["step"] in (8, 16)
    for task, lang in objectives:
        rows = read_jsonl(out / "predictions/validation" / task / f"{lang}.jsonl")
        assert [row["id"] for row in rows] == [str(i) for i in range(150)]


def test_a_timeout_kills_every_rank(tmp_path):
    """The harness itself: when torchrun's time is up, its ranks die with it (no orphan left waiting in a
    collective). torchrun starts each rank in a session of its own, so killing torchrun's process group alone would
    miss them: run_process kills the whole process tree."""
    worker = tmp_path / "hang.py"
    worker.write_text(
        "import os, pathlib, time\n"
        f"pathlib.Path({str(tmp_path)!r}, 'rank' + os.environ['RANK']).write_text(str(os.getpid()))\n"
        "time.sleep(600)\n"
    )
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port=0", str(worker)]
    with pytest.raises(subprocess.TimeoutExpired):
        run_process(command, clean_env(OMP_NUM_THREADS="1"), timeout=15)  # the ranks write their pids in a few s
    pids = [int((tmp_path / f"rank{r}").read_text()) for r in (0, 1)]
    deadline = time.monotonic() + 10  # killed ranks are reaped by init once torchrun, their parent, is gone
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in pids), f"a rank process survived the timeout: {pids}"


def alive(pid: int) -> bool:
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
