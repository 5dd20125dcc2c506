"""LF-MLF under ZeRO-3: two processes with every trainable tensor partitioned train like one process (ZeRO-2)
holding the whole global batch -- the same weights, ||d||², first-order changes g_tᵀΔθ and final weights within
the tolerances of the ZeRO-2 two-process test (tests/e2e/test_lfmlf_run.py) -- for full fine-tuning and
Multi-LoRA (with activation checkpointing); and one process under ZeRO-3 with checkpointing trains as under ZeRO-2
without it."""

from __future__ import annotations

import shutil

import pytest
import torch

from tests.helpers.launch import run_cli, run_torchrun
from tests.helpers.runs import (
    BASE_CONFIG,
    METHODS,
    assert_same_d_norm,
    final_weights,
    lfmlf_run,
    partitioned_zero3,
    read_jsonl,
    weighting_events,
)

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(600)]

OBJECTIVES = ("xnli/en", "xnli/de", "xnli/ar")


#: how the two-process ZeRO-3 run of each method makes its per-objective passes: full fine-tuning through DeepSpeed's
#: module hooks, layer by layer; Multi-LoRA with activation checkpointing, on the gathered model (its frozen base
#: weights are what ZeRO-3 would release under a recomputed layer: mtft/training/gram_step.py, ``_unpartitioned``)
PASSES = {
    "full": ({}, "the per-objective passes gather one layer at a time"),
    "multi_lora": ({"training.gradient_checkpointing": True}, "gather every parameter (activation checkpointing)"),
}


@pytest.mark.parametrize("method", list(METHODS))
def test_two_process_zero3_lfmlf_matches_one_process(tmp_path, method):
    extra = {**METHODS[method], "gradients.descent_check": True}
    one, two = tmp_path / "one", tmp_path / "two"
    result = run_cli("--config", BASE_CONFIG, *lfmlf_run(one, 2, micro=16, **extra), threads=1)
    assert result.returncode == 0, result.stderr[-3000:]
    passes, said = PASSES[method]
    zero3 = {**extra, **passes, "training.deepspeed_config": str(partitioned_zero3(tmp_path))}
    result = run_torchrun("--config", BASE_CONFIG, *lfmlf_run(two, 3, micro=8, **zero3))
    assert result.returncode == 0, result.stderr[-5000:]

    # DeepSpeed found the tensors in every module's output (mtft.models.heads.HeadOutput) for its backward hooks
    assert "cannot be detected" not in result.stdout + result.stderr
    log = (two / "train.log").read_text()
    assert "lfmlf under ZeRO-3: " in log and "(0 under DeepSpeed's persistence threshold" in log and said in log
    assert "ZeRO stage 3" in (two / "report.md").read_text()
    a, b = weighting_events(one), weighting_events(two)
    assert len(a) == len(b) == 12
    assert all(e["gram_shards"] == 2 for e in b)  # the per-objective gradients sharded over the two ranks
    for x, y in zip(a, b):
        for objective in OBJECTIVES:
            assert x[f"weight/{objective}"] == pytest.approx(y[f"weight/{objective}"], rel=1e-4, abs=1e-7)
        assert_same_d_norm(x, y)
        # g_tᵀΔθ of the update each run applied: the update reached the ZeRO-3 partitions as it did ZeRO-2's
        assert x["max_first_order"] == pytest.approx(y["max_first_order"], rel=1e-3, abs=1e-9), x["step"]
        assert x["common_descent"] == y["common_descent"]
    losses = [[e["loss"] for e in read_jsonl(out / "metrics.jsonl") if e["kind"] == "train"] for out in (one, two)]
    assert len(losses[0]) == len(losses[1]) == 12
    # the mean loss gap of the ZeRO-2 two-process test (tests/e2e/test_distributed.py: LOSS_TOLERANCE)
    assert sum(abs(x - y) for x, y in zip(*losses)) / 12 < 1e-5, list(zip(*losses))
    w1, w2 = final_weights(one), final_weights(two)
    assert w1.keys() == w2.keys() and all(w1[k].shape == w2[k].shape for k in w1)  # gathered, not partitions
    assert max((w1[k] - w2[k]).abs().max().item() for k in w1) < 1e-4


def test_one_process_zero3_lfmlf_matches_zero2(tmp_path):
    """One process under ZeRO-3 (no sharding of the per-objective gradients; the parameters still partitioned,
    into one part) with activation checkpointing trains as under ZeRO-2 without it: the recomputed layers'
    parameters are whole (the per-objective pass runs on the gathered model)."""
    zero2, zero3 = tmp_path / "zero2", tmp_path / "zero3"
    result = run_cli("--config", BASE_CONFIG, *lfmlf_run(zero2, 2, micro=16), threads=1)
    assert result.returncode == 0, result.stderr[-3000:]
    config = {"training.deepspeed_config": str(partitioned_zero3(tmp_path)), "training.gradient_checkpointing": True}
    linear = torch.nn.functional.linear
    result = run_cli("--config", BASE_CONFIG, *lfmlf_run(zero3, 3, micro=16, **config), threads=1)
    assert result.returncode == 0, result.stderr[-3000:]
    assert torch.nn.functional.linear is linear  # in this process (run_cli): not DeepSpeed's ZeRO-3 linear after it
    log = (zero3 / "train.log").read_text()
    assert "(0 under DeepSpeed's persistence threshold" in log and "(activation checkpointing)" in log
    a, b = weighting_events(zero2), weighting_events(zero3)
    assert len(a) == len(b) == 12 and not any("gram_shards" in e for e in b)
    for x, y in zip(a, b):
        for objective in OBJECTIVES:
            assert x[f"weight/{objective}"] == pytest.approx(y[f"weight/{objective}"], rel=1e-4, abs=1e-7)
        assert_same_d_norm(x, y)
    w1, w2 = final_weights(zero2), final_weights(zero3)
    assert max((w1[k] - w2[k]).abs().max().item() for k in w1) < 1e-5  # as ZeRO 0, 1 and 2 agree in one process


def test_two_process_zero3_lfmlf_resumes_bit_identically_with_bfloat16_buffers(tmp_path):
    """A two-process ZeRO-3 LF-MLF run (every tensor partitioned, per-objective buffers sharded and in bfloat16)
    resumed from its step-6 checkpoint -- the gathered weights and DeepSpeed's partitioned optimizer state --
    ends on the weights the uninterrupted run ended on, bit for bit."""
    out = tmp_path / "run"
    zero3 = {
        "training.deepspeed_config": str(partitioned_zero3(tmp_path)),
        "gradients.buffers": "bfloat16",
    }
    result = run_torchrun("--config", BASE_CONFIG, *lfmlf_run(out, 3, micro=8, **zero3))
    assert result.returncode == 0, result.stderr[-5000:]
    assert all(e["gram_shards"] == 2 for e in weighting_events(out))
    straight = final_weights(out)
    engine = out / f"checkpoints/step-{6:08d}/engine"
    assert sorted(p.name for p in engine.rglob("*optim_states.pt")) == [  # one partition per rank
        f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt" for rank in (0, 1)
    ]
    shutil.rmtree(out / f"checkpoints/step-{12:08d}")  # as if the run had stopped after step 6's checkpoint
    result = run_torchrun("--config", BASE_CONFIG, *lfmlf_run(out, 3, micro=8, **zero3), "--resume")
    assert result.returncode == 0, result.stderr[-5000:]
    assert f"resumed from {out}/checkpoints/step-{6:08d} at step 6" in result.stderr
    resumed = final_weights(out)
    assert straight.keys() == resumed.keys() and all(torch.equal(straight[k], resumed[k]) for k in straight)
