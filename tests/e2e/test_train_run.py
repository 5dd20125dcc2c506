"""End-to-end runs of run.py: the e2e base run learns and reports, the demo config runs, resume after SIGKILL,
a crash while saving, bad input."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mtft.config import load_config
from tests.helpers.launch import REPO, run_cli, run_script
from tests.helpers.runs import BASE_CONFIG, base_overrides, read_jsonl

PNG = b"\x89PNG\r\n\x1a\n"


def test_base_run_learns_and_reports(tmp_path):
    out = tmp_path / "base"
    # the base run as it is: full fine-tuning learns the fixture within 120 steps; Multi-LoRA is held to its own
    # bar in test_multi_lora_run.py
    result = run_cli("--config", BASE_CONFIG, *base_overrides(out, 120))
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["step"] == 120
    # chance is 1/3 on the 3-way fixture; a pipeline that learns is far above it in every language
    assert metrics["xnli/accuracy"] > 0.6, metrics
    for lang in ("en", "de", "ar", "zh"):
        assert metrics[f"xnli/{lang}/accuracy"] > 0.5
        predictions = read_jsonl(out / "predictions/validation/xnli" / f"{lang}.jsonl")
        assert len(predictions) == 150 and set(predictions[0]) == {"id", "prediction"}
        assert {p["prediction"] for p in predictions} <= {"entailment", "neutral", "contradiction"}
    report = (out / "report.md").read_text()
    assert "| **macro average** |" in report and "xnli/zh" in report and f"{metrics['xnli/accuracy']:.4f}" in report
    events = read_jsonl(out / "metrics.jsonl")
    train = [e for e in events if e["kind"] == "train"]
    assert [e["step"] for e in train][:2] == [20, 40] and "loss/xnli/de" in train[0] and "weight/xnli/de" in train[0]
    assert train[-1]["loss"] < train[0]["loss"]
    assert [e["step"] for e in events if e["kind"] == "eval"] == [60, 120]
    heads = json.loads((out / "best/heads.json").read_text())
    assert heads["xnli"]["label_names"] == ["entailment", "neutral", "contradiction"]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-00000060", "step-00000120"]
    assert (out / "config.yaml").is_file() and (out / "train.log").is_file()
    # weights load back through the same model code
    state = load_file(str(out / "checkpoints/step-00000120/model.safetensors"))
    assert any(k.startswith("heads.xnli.") for k in state) and any(k.startswith("encoder.") for k in state)


def test_demo_config_runs_shortened(tmp_path):
    """The one e2e test of configs/demo.yaml itself: the shipped demo, only shorter (20 steps, a 10-step
    pre-training, λ_p from at most 10 Hessian-vector products), runs through every stage it turns on. No learning
    bar: the demo's numbers are the README's."""
    out = tmp_path / "demo"
    # λ_p: one Hessian-vector product costs 2-4 s here, and power iteration took 47 of them on this backbone (188 s)
    shorter = [
        f"run.output_dir={out}",
        "training.max_steps=20",
        "evaluation.every_steps=10",
        "checkpointing.every_steps=10",
        "pretrain.tokens=20480",
        "forgetting.eigen_iterations=10",
        "logging.progress_bar=false",
    ]
    demo = load_config(REPO / "configs/demo.yaml", shorter)
    result = run_cli("--config", "configs/demo.yaml", *shorter)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert json.loads((out / "metrics.json").read_text())["step"] == 20
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-00000010", "step-00000020"]
    assert (out / "report.md").is_file()
    assert (out / "best/heads.json").is_file() == bool(demo.evaluation.metric_for_best)
    pretrained = "pre-training the backbone" in result.stderr or "pre-trained backbone from the cache" in result.stderr
    assert pretrained == demo.pretrain.before_finetune
    if demo.forgetting.enabled:
        assert (out / "forgetting.png").read_bytes()[:8] == PNG
        assert (out / "sensitivity.png").is_file() == bool(demo.forgetting.probe.gammas)


# The run resumed after SIGKILL: Multi-LoRA with the forgetting monitors on a pre-trained backbone (state beyond
# the weights and the optimizer: B's, the monitors' tracked sums), dropout on (the RNG must be restored too).
# Resuming needs λ_p only to be the same number in both runs, not converged: 10 Hessian-vector products, not 100
# (on these adapted weights power iteration does not converge in 100 either, and took ~5 of this file's minutes).
# 6 steps, a checkpoint, an evaluation and a train row every 2: the kill at step 4 lands after or during the second
# checkpoint with the first one kept, and rows logged past the checkpoint resumed from must not be repeated (what 30
# steps with a checkpoint every 10 showed, at 20 steps of training in all instead of 100).
STEPS, KILL_AT, EVERY = 6, 4, 2
RESUME_RUN = {
    "checkpointing.every_steps": EVERY,
    "evaluation.every_steps": EVERY,
    "logging.every_steps": EVERY,
    "data.tasks.0.languages": "[en,de]",
    "model.dropout": 0.1,
    "model.adapter.method": "multi_lora",
    "training.optimizer.lr": 1e-2,
    "pretrain.before_finetune": True,
    "forgetting.enabled": True,
    "forgetting.eigen_iterations": 10,
}


def kill_run(mode: str, step: int, out: Path) -> subprocess.CompletedProcess:
    args = ["--config", BASE_CONFIG, *base_overrides(out, STEPS, **RESUME_RUN)]
    return run_script("tests/helpers/kill_during_run.py", mode, str(step), *args)


def final_state(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out / f"checkpoints/step-{STEPS:08d}/model.safetensors"))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("straight") / "run"
    result = run_cli("--config", BASE_CONFIG, *base_overrides(out, STEPS, **RESUME_RUN))
    assert result.returncode == 0, result.stderr[-3000:]
    return out


@pytest.mark.parametrize("mode, expect_resume_step", [("after", KILL_AT), ("during", KILL_AT - EVERY)])
def test_resume_after_sigkill_matches_uninterrupted_run(tmp_path, uninterrupted, mode, expect_resume_step):
    out = tmp_path / "run"
    killed = kill_run(mode, KILL_AT, out)
    assert killed.returncode == -9, killed.stderr[-3000:]
    complete = sorted(p.name for p in (out / "checkpoints").iterdir())
    first, killed_at = f"step-{KILL_AT - EVERY:08d}", f"step-{KILL_AT:08d}"
    if mode == "during":  # the half-written checkpoint never looks complete
        assert complete == [first, f"{killed_at}.partial"]
        assert not (out / f"checkpoints/{killed_at}.partial/COMPLETE").exists()
    else:
        assert complete == [first, killed_at]
    resumed = run_cli("--config", BASE_CONFIG, *base_overrides(out, STEPS, **RESUME_RUN), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    resumed_from = f"{out}/checkpoints/step-{expect_resume_step:08d}"
    assert f"resumed from {resumed_from} at step {expect_resume_step}" in resumed.stderr
    expected, got = final_state(uninterrupted), final_state(out)
    assert expected.keys() == got.keys()
    for key in expected:
        assert torch.equal(expected[key], got[key]), key
    assert json.loads((out / "metrics.json").read_text()) == json.loads((uninterrupted / "metrics.json").read_text())
    # the log holds each step once, as in the uninterrupted run
    steps = [(e["step"], e["kind"]) for e in read_jsonl(out / "metrics.jsonl")]
    assert steps == [(e["step"], e["kind"]) for e in read_jsonl(uninterrupted / "metrics.jsonl")]


def test_output_dir_holding_another_run_is_refused(uninterrupted):
    before = (uninterrupted / "config.yaml").read_text()
    result = run_cli("--config", BASE_CONFIG, *base_overrides(uninterrupted, 5, **RESUME_RUN))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: output directory {uninterrupted} holds another run; set run.resume=true to continue it, "
        "run.overwrite=true to replace it, or choose another run.output_dir"
    )
    assert "Traceback" not in result.stderr
    assert (uninterrupted / "config.yaml").read_text() == before


def test_resume_with_a_different_config_is_refused(uninterrupted):
    result = run_cli("--config", BASE_CONFIG, *base_overrides(uninterrupted, 5, **RESUME_RUN), "--resume")
    assert result.returncode == 2 and "the config differs at training.max_steps" in result.stderr


@pytest.mark.parametrize(
    "override, message",
    [
        ("data.tasks.0.languages=[en,xx]", "task 'xnli' has no language(s) xx"),
        ("data.tasks.0.name=nli", "unknown task 'nli'; available tasks: "),
        (
            "data.sources.facebook/xnli=/nonexistent/{name}/{split}.jsonl",
            "dataset file not found: /nonexistent/en/train.jsonl",
        ),
        ("training.deepspeed_config=configs/deepspeed/none.json", "training.deepspeed_config: file not found"),
        ("evaluation.metric_for_best=xnli/f1", "evaluation.metric_for_best='xnli/f1' is not a metric of this run"),
        ("model.adapter.method=lora", "weighting.method=lfmlf needs per-objective gradients"),
        (
            "model.adapter.method=multi_lora model.adapter.granularity=objective data.tasks.0.protocol=zero_shot",
            "the evaluated xnli/de, xnli/ar, xnli/zh are not trained (zero-shot)",
        ),
        ("model.adapter.method=head weighting.shared=encoder", "no trainable parameter is shared by two objectives"),
        (
            "forgetting.enabled=true forgetting.retrieval.enabled=true forgetting.retrieval.layer=3",
            "forgetting.retrieval.layer=3: the encoder has 2 layers (0 is the embeddings)",
        ),
    ],
)
def test_bad_input_fails_in_one_line_and_writes_nothing(tmp_path, override, message):
    out = tmp_path / "never"
    result = run_cli("--config", BASE_CONFIG, *base_overrides(out, 5), *override.split())
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and message in last, last
    assert "Traceback" not in result.stderr
    assert not out.exists()


def test_sgd_cosine_accumulation_and_tensorboard(tmp_path):
    out = tmp_path / "sgd"
    result = run_cli(
        "--config",
        BASE_CONFIG,
        *base_overrides(
            out,
            12,
            **{
                "training.optimizer.name": "sgd",
                "training.optimizer.lr": 0.05,
                "training.scheduler.name": "cosine",
                "training.scheduler.warmup_steps": 3,
                "training.gradient_accumulation_steps": 2,
                "training.micro_batch_size": 8,
                "logging.report_to": "[tensorboard, wandb, mlflow]",
                "logging.every_steps": 1,
                "data.tasks.0.languages": "[en]",
            },
        ),
        WANDB_MODE="offline",  # W&B's offline mode: <run>/wandb, to `wandb sync` later; MLflow: <run>/mlruns
    )
    assert result.returncode == 0, result.stderr[-3000:]
    train = [e for e in read_jsonl(out / "metrics.jsonl") if e["kind"] == "train"]
    lrs = [e["lr"] for e in train]
    # the rate each step used (the schedule's value before the step): linear warm-up from 0, then cosine decay
    assert lrs[:4] == pytest.approx([0.0, 0.05 / 3, 0.1 / 3, 0.05]) and 0 < lrs[-1] < lrs[4] < lrs[3]
    assert all(e["examples_per_s"] > 0 for e in train)
    assert any(p.name.startswith("events.out.tfevents") for p in (out / "tensorboard").iterdir())
    # logging.report_to: the same rows through W&B (offline) and MLflow (its file store), per-objective losses included
    [wandb_run] = list((out / "wandb").glob("offline-run-*"))
    assert any(p.suffix == ".wandb" and p.stat().st_size > 0 for p in wandb_run.iterdir())
    [mlflow_loss] = list((out / "mlruns").glob("*/*/metrics/train/loss.xnli.en"))
    steps = [int(line.split()[2]) for line in mlflow_loss.read_text().splitlines()]
    assert steps == [e["step"] for e in train]
    ids = json.loads((out / "trackers.json").read_text())
    assert set(ids) == {"wandb", "mlflow"} and ids["mlflow"] == mlflow_loss.parents[2].name
    assert "global batch | 16" in (out / "report.md").read_text()


@pytest.mark.parametrize("method", ["mean", "lfmlf"])
def test_a_diverging_run_stops_with_one_line_and_is_not_complete(tmp_path, method):
    """SGD at lr 1e30 without clipping overflows the activations at step 2: the run says so and exits 2 instead of
    training on NaN weights to a report of NaN metrics and exit status 0."""
    out = tmp_path / "diverged"
    extra = {"training.optimizer": {"name": "sgd", "lr": 1e30}, "training.gradient_clipping": None}
    result = run_cli("--config", BASE_CONFIG, *base_overrides(out, 5, **extra, **{"weighting.method": method}))
    assert result.returncode == 2, result.stderr[-2000:]
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("error: training diverged at step ") and "is nan" in error and "lr" in error
    assert "Traceback" not in result.stderr
    stopped = [e for e in read_jsonl(out / "metrics.jsonl") if e["kind"] == "stopped"]
    assert stopped[-1]["reason"] == "diverged" and stopped[-1]["objectives"]
    assert not (out / "metrics.json").exists() and not (out / "report.md").exists()
