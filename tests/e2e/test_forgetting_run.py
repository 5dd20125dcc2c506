"""End-to-end: runs with forgetting monitors (full and Multi-LoRA), the budget, regularisation, the
pre-training stage and its cache, and ``run.py probe``."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers.launch import run_cli, run_torchrun
from tests.helpers.runs import BASE_CONFIG, base_overrides, partitioned_zero3, read_jsonl

PNG = b"\x89PNG\r\n\x1a\n"


def monitored(out: Path, steps: int, **extra) -> list[str]:
    """The base run with the forgetting monitors on, after the base's short pre-training (once per test session,
    then cached): full fine-tuning at lr 1e-3 with dropout, the setting the budget and regularisation thresholds
    were set on."""
    return [
        "--config",
        BASE_CONFIG,
        *base_overrides(
            out,
            steps,
            **{
                "pretrain.before_finetune": True,
                "forgetting.enabled": True,
                "model.dropout": 0.1,
                "forgetting.every_steps": 20,
                "evaluation.every_steps": None,
                "checkpointing.every_steps": None,
                "logging.every_steps": 10,
                "forgetting.probe.gammas": "[0.1, 1.0]",
                **extra,
            },
        ),
    ]


def events_of(out: Path, kind: str) -> list[dict]:
    return [e for e in read_jsonl(out / "metrics.jsonl") if e["kind"] == kind]


def test_monitored_run_reports_forgetting_bounds_probe_and_plots(tmp_path):
    """Three measurements and six displacements: 12 steps measured every 4 (what is checked holds at any step)."""
    out = tmp_path / "full"
    every = {"forgetting.every_steps": 4, "logging.every_steps": 2}
    result = run_cli(*monitored(out, 12, **every, **{"forgetting.retrieval.enabled": True}))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "pre-train" in result.stderr and "forgetting: λ_p = " in result.stderr
    [eigen] = events_of(out, "lambda_p")
    assert eigen["lambda_p"] > 0 and eigen["eigen_products"] >= 2 and set(eigen) >= {"eigen_residual", "cached"}
    measured = events_of(out, "forgetting")
    assert [e["step"] for e in measured] == [4, 8, 12]
    for e in measured:
        assert e["K"] == e["step"]
        assert e["bound_path"] >= e["bound_displacement"] > 0  # Cauchy–Schwarz
        assert {"F_p", "F_p/en", "F_p/zh", "lp/ar", "prediction", "linear", "quadratic", "F_batch"} <= set(e)
        assert e["F_p"] == pytest.approx(sum(e[f"F_p/{lang}"] for lang in ("en", "de", "ar", "zh")) / 4)
        # cross-lingual retrieval (the first corpus language with each other one), per pair and averaged
        pairs = [e[f"retrieval/en-{lang}"] for lang in ("de", "ar", "zh")]
        assert all(0 <= a <= 1 for a in pairs) and e["retrieval"] == pytest.approx(sum(pairs) / 3)
        assert e["retrieval_drop"] == pytest.approx(eigen["retrieval_pretrained"] - e["retrieval"])
    tracked = events_of(out, "displacement")
    assert [e["step"] for e in tracked] == [2, 4, 6, 8, 10, 12]
    assert all(b["sum_update_sq"] >= a["sum_update_sq"] for a, b in zip(tracked, tracked[1:]))
    probe = events_of(out, "probe")
    assert [(e["model"], e["gamma"]) for e in probe] == [
        ("pre-trained", 0.1),
        ("pre-trained", 1.0),
        ("fine-tuned", 0.1),
        ("fine-tuned", 1.0),
    ]
    assert all(e["seeds"] == 3 and e["dlp/mean/std"] >= 0 for e in probe)
    report = (out / "report.md").read_text()
    assert {"retrieval_pretrained", "retrieval_pretrained/en-de", "retrieval_pretrained/en-zh"} <= set(eigen)
    for section in (
        "## Forgetting (Theorem 1)",
        "| step | retrieval (mean) | en-de | en-ar | en-zh | drop |",
        "## Sensitivity (Gaussian probe)",
        "## Pareto-stationarity gauge",
        "![forgetting vs the Theorem-1 bounds](forgetting.png)",
        "(sensitivity.png)",
        "(stationarity.png)",
    ):
        assert section in report
    for plot in ("forgetting.png", "sensitivity.png", "stationarity.png"):
        assert (out / plot).read_bytes()[:8] == PNG
    assert json.loads((out / "probe.json").read_text())[0]["model"] == "pre-trained"
    # a second run reuses the pre-trained backbone and λ_p (2 steps, no probe: only its start is checked)
    again = run_cli(*monitored(tmp_path / "again", 2, **{"forgetting.probe.gammas": "[]"}))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "pre-trained backbone from the cache" in again.stderr
    [cached] = events_of(tmp_path / "again", "lambda_p")
    assert cached["cached"] is True and cached["lambda_p"] == eigen["lambda_p"]


def test_multi_lora_run_reports_forgetting_per_task_adapter(tmp_path):
    out = tmp_path / "lora"
    result = run_cli(
        *monitored(
            out,
            20,
            **{
                "weighting.method": "mean",
                "model.adapter.method": "multi_lora",
                "training.optimizer.lr": 3e-3,
                "model.adapter.target_modules": "[query,value]",
                "model.adapter.r": 8,
                "forgetting.probe.gammas": "[0.3]",
            },
        )
    )
    assert result.returncode == 0, result.stderr[-3000:]
    [eigen] = events_of(out, "lambda_p")
    state = load_file(str(out / "checkpoints/step-00000020/model.safetensors"))
    adapted = [k for k in state if k.endswith("base_layer.weight")]
    assert eigen["parameters"] == sum(state[k].numel() for k in adapted)  # λ_p over the adapted weights only
    last = events_of(out, "forgetting")[-1]
    assert {"F_p/xnli", "F_p/xnli/en", "bound_displacement/xnli", "prediction/xnli"} <= set(last)
    # the distance from B and A alone equals the explicit ||s·B·A||² over the adapted layers
    scaling = 16.0 / 8
    explicit = sum(
        float(
            (
                (
                    scaling
                    * state[k.replace("base_layer.weight", "lora_B.weight")][0]
                    @ state[k.replace("base_layer.weight", "lora_A")]
                )
                ** 2
            ).sum()
        )
        for k in adapted
    )
    assert last["distance/xnli"] ** 2 == pytest.approx(explicit, rel=1e-5)
    # the forgetting section explains the per-adapter models and has a table per task adapter (its wording is the
    # report's own: "Multi-LoRA: each task adapter ...", since reworded "Each adapter ... (Multi-LoRA: ...)")
    forgetting = (out / "report.md").read_text().split("## Forgetting (Theorem 1)")[1].split("\n## ")[0]
    assert "### xnli" in forgetting and "adapter" in forgetting and "Multi-LoRA" in forgetting
    assert [e["model"] for e in events_of(out, "probe")] == ["pre-trained", "fine-tuned/xnli"]


def test_forgetting_budget_stops_or_scales(tmp_path):
    stop = tmp_path / "stop"
    result = run_cli(
        *monitored(stop, 40, **{"forgetting.budget": "{value: 0.5, action: stop}", "forgetting.probe.gammas": "[]"})
    )
    assert result.returncode == 0, result.stderr[-3000:]
    [stopped] = events_of(stop, "stopped")
    assert stopped["reason"] == "forgetting_budget" and stopped["step"] < 40
    assert events_of(stop, "displacement")[-1]["bound_displacement"] > 0.5
    assert "passed the forgetting budget" in (stop / "report.md").read_text()

    scale = tmp_path / "scale"
    result = run_cli(
        *monitored(
            scale,
            12,
            **{
                "forgetting.budget": "{value: 0.5, action: scale}",
                "forgetting.probe.gammas": "[]",
                "weighting.method": "mean",
                "logging.every_steps": 4,  # the bound checked at three steps (measured: scaling starts at step 3)
            },
        )
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert events_of(scale, "budget")  # some updates were scaled
    assert all(e["bound_displacement"] <= 0.5 * (1 + 1e-6) for e in events_of(scale, "displacement"))
    assert json.loads((scale / "metrics.json").read_text())["step"] == 12


def test_regularization_towards_the_pretrained_weights_keeps_them_closer(tmp_path):
    """After 10 steps (measured: ||θ − θ_p|| 0.79 unregularised, 0.12 at λ = 50; after 20, 0.90 and 0.03)."""
    distances = {}
    for strength in (0.0, 50.0):
        out = tmp_path / f"reg{strength}"
        result = run_cli(
            *monitored(out, 10, **{"forgetting.regularization": strength, "forgetting.probe.gammas": "[]"})
        )
        assert result.returncode == 0, result.stderr[-3000:]
        distances[strength] = events_of(out, "displacement")[-1]["distance"]
    assert distances[50.0] < 0.8 * distances[0.0]


def test_pretrain_stage_checkpoints_at_budgets_and_probe_command(tmp_path):
    out = tmp_path / "pre"
    config = tmp_path / "pre.yaml"
    config.write_text(
        "run: {name: pre, stage: pretrain, seed: 3}\n"
        "model: {backbone: tiny, tiny: {hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2, "
        "intermediate_size: 64, vocab_size: 500}}\n"
        "data: {max_length: 32}\n"
        "corpus: {languages: [en, ar], max_eval_examples: 40}\n"
        "pretrain: {tokens: 20480, save_at_tokens: [5120], micro_batch_size: 16, log_every_steps: 10,\n"
        "           optimizer: {name: adamw, lr: 3.0e-3}}\n"
    )
    result = run_cli("--config", str(config), f"run.output_dir={out}", "logging.progress_bar=false")
    assert result.returncode == 0, result.stderr[-3000:]
    folders = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert folders == ["tokens-20480", "tokens-5120"]
    early, late = (json.loads((out / f"checkpoints/{f}/pretrain.json").read_text()) for f in reversed(folders))
    assert (early["steps"], late["steps"]) == (10, 40) and late["tokens_seen"] == 20480
    assert late["lp"]["en"] < early["lp"]["en"]  # more pre-training, lower held-out masked-LM loss
    # one schedule: the early checkpoint is an intermediate one, not annealed; the last ends its cosine at 0
    assert early["schedule_steps"] == late["schedule_steps"] == 40 and early["lr_after"] > 0 == late["lr_after"]
    assert (out / "pretrain.png").read_bytes()[:8] == PNG and "## Checkpoints" in (out / "report.md").read_text()

    weights = load_file(str(out / "checkpoints/tokens-20480/model.safetensors"))
    probe = run_cli(
        "probe",
        "--checkpoint",
        str(out / "checkpoints/tokens-5120"),
        "--checkpoint",
        str(out / "checkpoints/tokens-20480"),
        "--gamma",
        "0.3,1",
        "--max-examples",
        "20",
        "--out",
        str(tmp_path / "probe"),
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    assert "tokens-20480  γ=1" in probe.stdout
    results = json.loads((tmp_path / "probe" / "probe.json").read_text())
    assert [r["model"] for r in results] == ["tokens-5120", "tokens-20480"]
    assert [len(r["trials"]) for r in results] == [6, 6] and set(results[0]["baseline"]) == {"en", "ar"}
    assert (tmp_path / "probe" / "sensitivity.png").read_bytes()[:8] == PNG
    after = load_file(str(out / "checkpoints/tokens-20480/model.safetensors"))  # the probe never writes weights
    assert all(torch.equal(weights[k], after[k]) for k in weights)

    # continued pre-training from a checkpoint folder (its own tokenizer and MLM head)
    more = tmp_path / "more"
    result = run_cli(
        "--config",
        str(config),
        f"run.output_dir={more}",
        "logging.progress_bar=false",
        f"model.backbone={out / 'checkpoints/tokens-20480'}",
        "pretrain.tokens=5120",
        "pretrain.save_at_tokens=[]",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    meta = json.loads((more / "checkpoints/tokens-5120/pretrain.json").read_text())
    assert meta["backbone"].endswith("tokens-20480") and meta["steps"] == 10
    assert "(continued)" in (more / "report.md").read_text()

    # schedule_per_budget: every budget its own schedule, annealed to zero at that budget (Springer et al., 2025)
    apart = tmp_path / "apart"
    result = run_cli("--config", str(config), f"run.output_dir={apart}", "pretrain.schedule_per_budget=true")
    assert result.returncode == 0, result.stderr[-3000:]
    for folder, steps in (("tokens-5120", 10), ("tokens-20480", 40)):
        meta = json.loads((apart / "checkpoints" / folder / "pretrain.json").read_text())
        assert meta["steps"] == meta["schedule_steps"] == steps and meta["lr_after"] == 0.0


def test_monitors_leave_training_bit_identical_and_probe_of_a_finetuning_checkpoint(tmp_path):
    out, watched = tmp_path / "ft", tmp_path / "watched"
    result = run_cli(*monitored(out, 6, **{"forgetting.enabled": False, "checkpointing.every_steps": 3}))
    assert result.returncode == 0, result.stderr[-3000:]
    result = run_cli(*monitored(watched, 6, **{"forgetting.every_steps": 3, "checkpointing.every_steps": 3}))
    assert result.returncode == 0, result.stderr[-3000:]
    assert [e["step"] for e in events_of(watched, "forgetting")] == [3, 6] and not events_of(out, "forgetting")
    plain, monitored_weights = (
        load_file(str(o / "checkpoints/step-00000006/model.safetensors")) for o in (out, watched)
    )
    assert all(torch.equal(plain[k], monitored_weights[k]) for k in plain)  # no RNG draw, no weight touched
    state = json.loads((watched / "checkpoints/step-00000006/trainer_state.json").read_text())["forgetting"]
    assert state["steps"] == 6 and state["distance_sq"][0] > 0
    probe = run_cli(
        "probe",
        "--checkpoint",
        str(out / "checkpoints/step-00000006"),
        "--gamma",
        "0.5",
        "--languages",
        "en,de",
        "--max-examples",
        "20",
        "--out",
        str(tmp_path / "probe"),
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    [row] = json.loads((tmp_path / "probe" / "probe.json").read_text())
    assert row["model"] == "step-00000006" and set(row["baseline"]) == {"en", "de"}


@pytest.mark.parametrize(
    "args, message",
    [
        (["--gamma", "0.1,x"], "--gamma '0.1,x': expected comma-separated numbers"),
        (["--gamma", "0.1,-1"], "every γ must be a number > 0"),
        (["--gamma", "0.1", "--seeds", "2"], "--seeds 2: at least 3 noise seeds"),
    ],
)
def test_probe_command_rejects_bad_input(tmp_path, args, message):
    result = run_cli("probe", "--checkpoint", str(tmp_path), *args)
    assert result.returncode == 2 and message in result.stderr
    assert "Traceback" not in result.stderr and result.stderr.strip().startswith("error:")


def test_probe_command_rejects_a_folder_that_is_no_checkpoint(tmp_path):
    result = run_cli("probe", "--checkpoint", str(tmp_path), "--gamma", "0.1")
    assert result.returncode == 2 and "neither a Hugging Face folder" in result.stderr
    assert "Traceback" not in result.stderr


#: the monitors of the runs that two processes and one must agree on: measured at steps 4 and 8 of 8, dropout off
MATCHED = {
    # λ_p from a few Lanczos steps (of the 40 its tolerance takes here): what is compared is the same computation on
    # one process and two, which as many steps as the default spend would not make more telling
    "forgetting.eigen_iterations": 8,
    "forgetting.every_steps": 4,
    "forgetting.probe.gammas": "[0.5]",
    "forgetting.retrieval.enabled": True,
    "model.dropout": 0.0,
    "model.classifier_dropout": 0.0,
}
METHODS = {"full": {}, "multi_lora": {"model.adapter.method": "multi_lora", "training.optimizer.lr": 1e-2}}
BACKBONE = r"(?<![\w=])/\S+/pretrained/[0-9a-f]{24}"


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The one-process ZeRO-2 run of a method (micro-batch 16) that the two-process runs (micro-batch 8 each) are
    compared with, made once for the module: ``one_process(method)`` gives its output folder and the pre-trained
    backbone it fine-tuned. The full fine-tuning run serves both the ZeRO-2 and the ZeRO-3 comparison."""
    runs: dict[str, tuple[Path, str]] = {}

    def run(method: str) -> tuple[Path, str]:
        if method not in runs:
            out = tmp_path_factory.mktemp(f"one-{method}") / "one"
            zero2 = {"training.deepspeed_config": "configs/deepspeed/zero2.json", "training.micro_batch_size": 16}
            result = run_cli(*monitored(out, 8, **MATCHED, **METHODS[method], **zero2))
            assert result.returncode == 0, result.stderr[-3000:]
            [backbone] = set(re.findall(BACKBONE, result.stdout + result.stderr))
            runs[method] = out, backbone
        return runs[method]

    return run


@pytest.mark.multiprocess
@pytest.mark.timeout(600)  # two 8-step runs (the pre-training cached or not), a few minutes at most
def test_two_processes_share_lambda_p_and_report_the_same_forgetting(one_process, tmp_path):
    """Two ZeRO-2 processes read the λ_p that one process computed and cached, and measure the F_p it does. The
    same θ_p: the pre-training cache is keyed on the process count (two processes would pre-train another
    backbone), so the two-process run fine-tunes the backbone the one-process run pre-trained, by its folder. Its
    probe and retrieval are off: the ZeRO-3 test below compares those on two processes."""
    one, backbone = one_process("full")
    two = tmp_path / "two"
    same_backbone = {"model.backbone": backbone, "pretrain.before_finetune": False}
    zero2 = {"training.deepspeed_config": "configs/deepspeed/zero2.json", "training.micro_batch_size": 8}
    monitors = {**MATCHED, "forgetting.probe.gammas": "[]", "forgetting.retrieval.enabled": False}
    result = run_torchrun(*monitored(two, 8, **monitors, **same_backbone, **zero2))
    assert result.returncode == 0, result.stderr[-5000:]
    [a], [b] = events_of(one, "lambda_p"), events_of(two, "lambda_p")
    assert b["cached"] is True and a["lambda_p"] == b["lambda_p"]  # the same θ_p: rank 0's cached value
    for x, y in zip(events_of(one, "forgetting"), events_of(two, "forgetting")):
        assert x["step"] == y["step"] and x["F_p"] == pytest.approx(y["F_p"], rel=1e-3, abs=1e-5)
    assert all(e["ranks_in_sync"] for e in events_of(two, "sync"))


@pytest.mark.multiprocess
@pytest.mark.timeout(600)  # two 8-step runs after the cached pre-training, a few minutes at most
@pytest.mark.parametrize("method", list(METHODS))
def test_zero3_monitors_on_two_processes_match_one_process(one_process, tmp_path, method):
    """Under ZeRO-3 the monitors measure a whole replica refreshed from the partitions (mtft.forgetting.replica):
    two processes with every trainable tensor partitioned report the λ_p (computed, not read from the cache),
    displacements, bounds, F_p, second-order prediction and cross-lingual retrieval that one ZeRO-2 process does,
    and rank 0 writes the probe."""
    one, cached = one_process(method)
    two = tmp_path / "two"
    # the ZeRO-3 run computes λ_p itself: it fine-tunes a copy of the backbone without the cached λ_p (the cache is
    # the session's, shared with the tests that read λ_p from it)
    backbone = str(shutil.copytree(cached, tmp_path / "backbone", ignore=shutil.ignore_patterns("lambda_p")))
    zero3 = {
        "model.backbone": backbone,
        "pretrain.before_finetune": False,
        "training.deepspeed_config": str(partitioned_zero3(tmp_path)),
        "training.micro_batch_size": 8,
    }
    result = run_torchrun(*monitored(two, 8, **MATCHED, **METHODS[method], **zero3))
    assert result.returncode == 0, result.stderr[-5000:]
    assert "forgetting monitors under ZeRO-3: a whole replica of the encoder" in (two / "train.log").read_text()
    [a], [b] = events_of(one, "lambda_p"), events_of(two, "lambda_p")
    assert b["cached"] is False and b["lambda_p"] == pytest.approx(a["lambda_p"], rel=1e-4)
    rows = list(zip(events_of(one, "forgetting"), events_of(two, "forgetting"), strict=True))
    assert [x["step"] for x, _ in rows] == [4, 8]
    for x, y in rows:  # displacements, bounds, L_p and F_p per language, the second-order prediction
        assert x.keys() == y.keys() and any(k.startswith("bound_path") for k in x)
        for key, value in x.items():
            if key.startswith("retrieval"):  # a share of 200 nearest neighbours: a near-tie may flip one of them
                assert y[key] == pytest.approx(value, abs=0.011), (x["step"], key)
            elif key != "seconds" and isinstance(value, float):
                # rel seen: 5e-4. F_p is a difference of L_p values near 6 whose float noise between the two
                # partitionings is ~1e-6 of L_p: an F_p of 0.005 moved by 6e-6 (1e-3 of it) after 4 steps
                assert y[key] == pytest.approx(value, rel=1e-3, abs=2e-5), (x["step"], key)
        assert ("retrieval/en-zh" if method == "full" else "retrieval/xnli/en-zh") in y  # Multi-LoRA: per adapter
    probes = [json.loads((out / "probe.json").read_text()) for out in (one, two)]
    assert [r["model"] for r in probes[0]] == [r["model"] for r in probes[1]] and probes[0]
    for x, y in zip(*probes):
        assert y["baseline"] == pytest.approx(x["baseline"], rel=1e-3), x["model"]
