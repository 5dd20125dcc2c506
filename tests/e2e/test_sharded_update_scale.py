"""The sharded LF-MLF update reaches the optimizer at its scale under ZeRO 0, 2 and 3. On two processes each rank
hands the engine N × its part of Σ_t w_t ḡ_t and zeros elsewhere (``ShardedGradients.contribution``), and DeepSpeed's
own averaging has to complete the combination, not a multiple of it: under ZeRO-0 it multiplies the all-reduced
gradient by 1/N, under ZeRO-2 and ZeRO-3 it divides each rank's gradient by N before the reduce-scatter. AdamW and
gradient clipping would hide a wrong factor (AdamW's update barely depends on the gradient's scale, clipping
rescales it), so these runs step with plain SGD (no momentum, weight decay, clipping or schedule): Δθ = −lr · Σ_t w_t
ḡ_t, and each objective's first-order change g_tᵀΔθ (``gradients.descent_check``) and the final weights must equal
one process's, which holds the per-objective gradients whole and hands the engine the combination itself."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.helpers.launch import run_cli, run_torchrun
from tests.helpers.runs import BASE_CONFIG, base_overrides, partitioned_zero3, weighting_events

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(600)]
STEPS = 4
LANGUAGES = ("en", "de", "ar")


def sgd_run(out: Path, deepspeed_config: str, micro: int) -> list[str]:
    return base_overrides(
        out,
        STEPS,
        **{
            "training.deepspeed_config": deepspeed_config,
            "training.micro_batch_size": micro,
            "training.optimizer": {"name": "sgd", "lr": 0.5, "momentum": 0.0, "weight_decay": 0.0},
            "training.scheduler": {"name": "constant"},
            "training.gradient_clipping": None,
            "gradients.descent_check": True,
            "model.classifier_dropout": 0.0,
            "data.tasks.0.languages": f"[{', '.join(LANGUAGES)}]",
            "logging.every_steps": 1,
            "checkpointing.every_steps": STEPS,
            "evaluation.every_steps": None,
        },
    )


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sgd") / "one"
    result = run_cli("--config", BASE_CONFIG, *sgd_run(out, "configs/deepspeed/zero2.json", micro=16), threads=1)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


@pytest.mark.parametrize("zero", [0, 2, 3])
def test_two_processes_apply_the_combined_gradient_at_its_scale(one_process, tmp_path, zero):
    config = str(partitioned_zero3(tmp_path)) if zero == 3 else f"configs/deepspeed/zero{zero}.json"
    two = tmp_path / "two"
    result = run_torchrun("--config", BASE_CONFIG, *sgd_run(two, config, micro=8))
    assert result.returncode == 0, result.stderr[-5000:]

    a, b = weighting_events(one_process), weighting_events(two)
    assert len(a) == len(b) == STEPS
    assert all(e["gram_shards"] == 2 for e in b) and not any("gram_shards" in e for e in a)
    for x, y in zip(a, b):
        for language in LANGUAGES:
            key = f"first_order/xnli/{language}"
            assert x[key] < 0  # SGD along the min-norm direction d: g_tᵀΔθ = −lr·g_tᵀd ≤ −lr·||d||² < 0
            # float32 summation order: measured within 3.2e-6 on the previous fixtures, 3.3e-4 on the world of
            # translations (at step 4, where g_tᵀΔθ is down to 1e-4); a wrong factor in the engine's average of the
            # contributions (N × this rank's part: 1× in its place) showed as a 5% gap at step 1
            assert y[key] == pytest.approx(x[key], rel=1e-3), (x["step"], key, x[key], y[key])
    w1 = load_file(str(one_process / f"checkpoints/step-{STEPS:08d}/model.safetensors"))
    w2 = load_file(str(two / f"checkpoints/step-{STEPS:08d}/model.safetensors"))
    assert w1.keys() == w2.keys()
    assert max((w1[k] - w2[k]).abs().max().item() for k in w1) < 1e-5  # measured 6.5e-7 at most
