"""The preconditioner read from a real DeepSpeed engine's AdamW state is 1/(√v̂ + ε) computed by hand, under ZeRO
0, 1 and 2; SGD and an optimizer that has not stepped yet give the Euclidean metric (None); the config options."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from mtft.config.load import load_config
from mtft.core.errors import ConfigError
from tests.helpers.launch import REPO, clean_env, run_process

BETAS, EPS, STEPS = (0.8, 0.9), 1e-3, 3
SHAPES = {"weight": (2, 3), "bias": (2,)}


def gradients(step: int) -> dict[str, np.ndarray]:
    """The gradient fed at step ``step`` (1-based), per parameter: random, with entries of different sizes."""
    rng = np.random.default_rng(step)
    return {name: rng.normal(size=shape) * np.exp(rng.normal(size=shape)) for name, shape in SHAPES.items()}


def probe() -> None:
    """Run in a subprocess (a process group and DeepSpeed of its own): for ZeRO 0, 1, 2 and SGD, step a
    Linear(3, 2) whose loss Σ_θ ⟨θ, C_k⟩ has the known gradient C_k, and print what AdamWPreconditioner reads."""
    import torch

    from mtft.core.distributed import init_distributed

    init_distributed()
    import deepspeed

    from mtft.training.adamw_preconditioner import AdamWPreconditioner

    out = {}
    for case in ("zero0", "zero1", "zero2", "sgd"):
        torch.manual_seed(0)
        layer = torch.nn.Linear(3, 2)
        groups = [  # as build_optimizer: decayed matrices, undecayed vectors (two groups: ZeRO partitions each)
            {"params": [layer.weight], "weight_decay": 0.01},
            {"params": [layer.bias], "weight_decay": 0.0},
        ]
        if case == "sgd":
            optimizer = torch.optim.SGD(groups, lr=1e-2, momentum=0.9)
        else:
            optimizer = torch.optim.AdamW(groups, lr=1e-2, betas=BETAS, eps=EPS)
        config = {
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 1,
            "gradient_clipping": 0.0,
            "zero_optimization": {"stage": int(case[-1]) if case != "sgd" else 0},
            "zero_allow_untested_optimizer": True,
        }
        engine, *_ = deepspeed.initialize(model=layer, optimizer=optimizer, config=config)
        metric = AdamWPreconditioner(engine)
        params = {"weight": layer.weight, "bias": layer.bias}
        result = {"adaptive": metric.adaptive, "before_first_step": metric.diagonal(list(params.values())) is None}
        for k in range(1, STEPS + 1):
            fed = gradients(k)
            loss = sum((params[n] * torch.tensor(fed[n], dtype=torch.float32)).sum() for n in params)
            engine.backward(loss)
            engine.step()
        diagonal = metric.diagonal(list(params.values()))
        result["step"] = metric.step()
        result["p"] = None if diagonal is None else {n: diagonal[p].tolist() for n, p in params.items()}
        out[case] = result
    print("RESULT " + json.dumps(out))


@pytest.fixture(scope="module")
def probed() -> dict:
    command = [sys.executable, "-c", "from tests.unit.training.test_adamw_preconditioner import probe; probe()"]
    result = run_process(command, clean_env(OMP_NUM_THREADS="1"), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(x for x in result.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def by_hand() -> dict[str, np.ndarray]:
    """v_k = β2·v_{k−1} + (1 − β2)·g_k², v̂ = v_K/(1 − β2^K), p = 1/(√v̂ + ε) (Kingma & Ba, 2015, Algorithm 1)."""
    beta2 = BETAS[1]
    v = {name: np.zeros(shape) for name, shape in SHAPES.items()}
    for k in range(1, STEPS + 1):
        for name, g in gradients(k).items():
            v[name] = beta2 * v[name] + (1 - beta2) * g**2
    return {name: 1.0 / (np.sqrt(v[name] / (1 - beta2**STEPS)) + EPS) for name in SHAPES}


@pytest.mark.parametrize("stage", ["zero0", "zero1", "zero2"])
def test_adamw_preconditioner_equals_the_hand_computed_one(probed, stage):
    got = probed[stage]
    assert got["adaptive"] and got["before_first_step"]  # no state before the first step: Euclidean
    assert got["step"] == STEPS
    expected = by_hand()
    for name in SHAPES:
        np.testing.assert_allclose(np.array(got["p"][name]), expected[name], rtol=1e-5)
    # ε is large enough here to be seen: 1/√v̂ without it differs from p by far more than the tolerance
    assert all((1.0 / (1.0 / expected[n] - EPS) / expected[n] - 1).max() > 1e-4 for n in SHAPES)


def test_sgd_applies_no_preconditioner(probed):
    assert probed["sgd"] == {"adaptive": False, "before_first_step": True, "step": 0, "p": None}


def config_with(tmp_path, *overrides: str):
    return load_config(REPO / "tests/e2e/base.yaml", [f"run.output_dir={tmp_path / 'out'}", *overrides])


def test_config_options(tmp_path):
    assert config_with(tmp_path).gradients.metric == "euclidean"  # plain LF-MLF by default
    assert not config_with(tmp_path).gradients.descent_check
    config = config_with(tmp_path, "gradients.metric=optimizer", "gradients.descent_check=true")
    assert config.gradients.metric == "optimizer" and config.per_objective_gradients()
    # with SGD the optimizer's metric is the Euclidean one: accepted (and the run says so)
    assert config_with(tmp_path, "gradients.metric=optimizer", "training.optimizer.name=sgd").gradients.metric
    # mean + descent_check: per-objective gradients without a Gram
    assert config_with(tmp_path, "weighting.method=mean", "gradients.descent_check=true").per_objective_gradients()
    assert not config_with(tmp_path, "weighting.method=mean").per_objective_gradients()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["weighting.method=mean", "gradients.metric=optimizer"], "reads no Gram"),
        (["gradients.metric=adam"], "metric"),
        (["weighting.method=mean", "gradients.descent_check=true", "model.adapter.method=lora"], "descent_check"),
    ],
)
def test_config_refusals(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        config_with(tmp_path, *overrides)
