"""LF-MLF through run.py and DeepSpeed: ZeRO 0/1/2 agree, two processes match one bit-identically across ranks,
the bufferless step with activation checkpointing trains as the buffered one, the report shows the weights and the
stationarity gauge, and Pareto stationarity can stop training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.helpers.launch import run_cli, run_torchrun
from tests.helpers.runs import (
    BASE_CONFIG,
    METHODS,
    STEPS,
    assert_same_d_norm,
    base_overrides,
    final_weights,
    lfmlf_run,
    read_jsonl,
    weighting_events,
)

# LF-MLF weights of bfloat16 against full-precision buffers over the 12 steps: measured 3.8e-3 at most (the
# trajectories part as the rounded gradients move the model), so 5x that
BFLOAT16_WEIGHT_GAP = 2e-2


@pytest.fixture(scope="module", params=list(METHODS))
def zero_runs(request, tmp_path_factory) -> dict[str, Path]:
    """The same 12 LF-MLF steps under ZeRO 0, 1, 2 and with two processes, for Multi-LoRA and full fine-tuning.
    It launches torchrun: its tests are marked multiprocess, with a timeout that also covers this set-up (about
    1-2 minutes per method, in the first test that uses it)."""
    runs, method = {}, METHODS[request.param]
    base = tmp_path_factory.mktemp(f"lfmlf-{request.param}")
    for zero in (0, 1, 2):
        out = base / f"zero{zero}"
        result = run_cli("--config", BASE_CONFIG, *lfmlf_run(out, zero, micro=16, **method))
        assert result.returncode == 0, result.stderr[-3000:]
        runs[f"zero{zero}"] = out
    out = base / "two"
    result = run_torchrun("--config", BASE_CONFIG, *lfmlf_run(out, 2, micro=8, **method))
    assert result.returncode == 0, result.stderr[-5000:]
    runs["two"] = out
    # the bufferless step (chosen by auto: the budget is far below the buffers), with activation checkpointing; for
    # full fine-tuning with no tape (the Gram during the backward pass, the update by a second one)
    out = base / "bufferless"
    update = {"gradients.update": UPDATES[request.param]}
    result = run_cli("--config", BASE_CONFIG, *lfmlf_run(out, 2, micro=16, **method, **BUFFERLESS, **update))
    assert result.returncode == 0, result.stderr[-3000:]
    runs["bufferless"] = out
    if request.param == "multi_lora":  # and on two processes (its Gram reduce-scattered layer by layer)
        out = base / "two_bufferless"
        result = run_torchrun("--config", BASE_CONFIG, *lfmlf_run(out, 2, micro=8, **method, **BUFFERLESS))
        assert result.returncode == 0, result.stderr[-5000:]
        runs["two_bufferless"] = out
    return runs


UPDATES = {"multi_lora": "tape", "full": "backward"}  # gradients.update of each method's bufferless run
BUFFERLESS = {
    "gradients.buffers": "auto",
    "gradients.budget_gb": 1e-6,
    "gradients.chunk_mb": 0.05,  # every Linear by windows of its rows, the embedding by touched rows
    "training.gradient_checkpointing": True,
}


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_every_step_logs_weights_certificate_and_stationarity(zero_runs):
    events = weighting_events(zero_runs["zero0"])
    assert [e["step"] for e in events] == list(range(1, STEPS + 1))
    for e in events:
        weights = [e[f"weight/xnli/{lang}"] for lang in ("en", "de", "ar")]
        assert min(weights) >= 0 and sum(weights) == pytest.approx(1.0, abs=1e-9)
        assert e["fw_gap"] <= 1e-8 * max(1.0, e["mean_grad_norm_sq"])  # solver optimality certificate
        assert e["theorem2"] >= -1e-8 * max(1.0, e["mean_grad_norm_sq"])  # dᵀg_t ≥ ||d||² for every t
        assert 0 <= e["stationarity"] <= 1 + 1e-9  # ||d||² never exceeds the mean ||g_t||²
    cosines = [e for e in read_jsonl(zero_runs["zero0"] / "metrics.jsonl") if e["kind"] == "cosines"]
    assert [e["step"] for e in cosines] == [4, 8, 12]
    assert cosines[0]["objectives"] == ["xnli/en", "xnli/de", "xnli/ar"]
    assert all(abs(cosines[0]["matrix"][i][i] - 1) < 1e-9 for i in range(3))
    report = (zero_runs["zero0"] / "report.md").read_text()
    assert "## Loss weighting" in report and "stationarity" in report and "| xnli/en | xnli/de | xnli/ar |" in report


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
@pytest.mark.parametrize("stage", ["zero1", "zero2"])
def test_zero_stages_give_the_same_training(zero_runs, stage):
    reference, other = weighting_events(zero_runs["zero0"]), weighting_events(zero_runs[stage])
    for a, b in zip(reference, other):
        for key in ("weight/xnli/en", "weight/xnli/de", "weight/xnli/ar"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-7), (a["step"], key)
        assert_same_d_norm(a, b)
    w0, w1 = final_weights(zero_runs["zero0"]), final_weights(zero_runs[stage])
    assert max((w0[k] - w1[k]).abs().max().item() for k in w0) < 1e-5


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_the_bufferless_step_trains_as_the_buffered_one(zero_runs):
    """gradients.buffers=auto chose the bufferless step (the log says why) and, with activation
    checkpointing and its layers formed in chunks of gradients.chunk_mb, on one process (and two, for
    Multi-LoRA) it gives the buffered step's weights to float32 round-off -- from a tape (Multi-LoRA), and with the
    Gram formed during the backward pass and the update by a second one (full fine-tuning)."""
    runs = [run for run in ("bufferless", "two_bufferless") if run in zero_runs]
    assert "bufferless" in runs
    for run in runs:
        log = (zero_runs[run] / "train.log").read_text()
        assert "per-objective gradients bufferless: auto (" in log and "exceed the budget" in log
        assert "products formed in chunks of at most 51.2 KiB (gradients.chunk_mb=0.05)" in log
        method = zero_runs[run].parent.name.split("-")[1].rstrip("0123456789")  # lfmlf-<method><n>
        update = UPDATES[method]
        assert {
            "tape": "lfmlf: the update from a tape of the backward pass (gradients.update=tape)",
            "backward": "lfmlf: the Gram formed during the backward pass, the update by a second backward pass of "
            "the weighted losses (gradients.update=backward)",
        }[update] in log, run
        reference, other = weighting_events(zero_runs["zero2"]), weighting_events(zero_runs[run])
        assert len(reference) == len(other) == STEPS and not any("gram_shards" in e for e in other)
        for a, b in zip(reference, other):
            for key in ("weight/xnli/en", "weight/xnli/de", "weight/xnli/ar"):
                assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-7), (run, a["step"], key)
            assert_same_d_norm(a, b)
        w0, w1 = final_weights(zero_runs["zero2"]), final_weights(zero_runs[run])
        assert max((w0[k] - w1[k]).abs().max().item() for k in w0) < 1e-4, run


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_two_processes_match_one_and_ranks_stay_bit_identical(zero_runs):
    one, two = weighting_events(zero_runs["zero2"]), weighting_events(zero_runs["two"])
    assert len(one) == len(two) == STEPS
    # two processes shard the per-objective gradients (mtft/gradients/sharded.py); one holds them whole
    assert all(e["gram_shards"] == 2 for e in two) and not any("gram_shards" in e for e in one)
    for a, b in zip(one, two):
        assert a["weight/xnli/de"] == pytest.approx(b["weight/xnli/de"], rel=1e-4, abs=1e-7)
        assert_same_d_norm(a, b)
    syncs = [e for e in read_jsonl(zero_runs["two"] / "metrics.jsonl") if e["kind"] == "sync"]
    assert [e["step"] for e in syncs] == [6, STEPS] and all(e["ranks_in_sync"] for e in syncs)
    w1, w2 = final_weights(zero_runs["zero2"]), final_weights(zero_runs["two"])
    # Adam moves every weight by up to lr (1e-2 for Multi-LoRA) per step whatever its gradient's size, so float32
    # summation-order noise in near-zero gradients shows in the weights: allow 1% of one such step
    assert max((w1[k] - w2[k]).abs().max().item() for k in w1) < 1e-4


def test_pareto_stationarity_stops_training(tmp_path):
    out = tmp_path / "stationary"
    # ||d||²/mean||g_t||² ≤ 1 always, so eps = 2 makes every step "stationary": stop after the patience
    result = run_cli(
        "--config",
        BASE_CONFIG,
        *lfmlf_run(out, 0, 16, **{"weighting.stationarity_eps": 2.0, "weighting.stationarity_patience": 3}),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    stopped = [e for e in read_jsonl(out / "metrics.jsonl") if e["kind"] == "stopped"]
    assert stopped == [{"step": 3, "kind": "stopped", "reason": "pareto_stationary"}]
    assert json.loads((out / "metrics.json").read_text())["step"] == 3
    assert "Training stopped at step 3: pareto_stationary." in (out / "report.md").read_text()


@pytest.mark.parametrize("method", ["mgda_normalized", "pcgrad", "cagrad", "imtl_g"])
def test_comparison_weightings_train(tmp_path, method):
    out = tmp_path / method
    result = run_cli("--config", BASE_CONFIG, *lfmlf_run(out, 0, 16, **{"weighting.method": method}))
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(weighting_events(out)) == STEPS


@pytest.mark.parametrize("options", [{"floor": 0.3}, {"normalize": "loss+"}])
def test_lfmlf_options_train(tmp_path, options):
    """The collapse guard and a Sener & Koltun normalisation reach the weighting from the config and train."""
    out = tmp_path / "options"
    result = run_cli("--config", BASE_CONFIG, *lfmlf_run(out, 0, 16, **{"weighting.options": options}))
    assert result.returncode == 0, result.stderr[-3000:]
    events = weighting_events(out)
    assert len(events) == STEPS
    floor = options.get("floor", 0.0)
    for e in events:
        weights = [e[f"weight/xnli/{lang}"] for lang in ("en", "de", "ar")]
        assert sum(weights) == pytest.approx(1.0, abs=1e-9) and e["floor"] == floor
        assert min(w for w in weights if w > 0) >= floor / 3 and "min_d_dot_g" in e
    report = (out / "report.md").read_text()
    option = ", ".join(f"{k}={v}" for k, v in options.items())
    assert f"| weighting | lfmlf over task_language ({option}) |" in report
    assert ("Collapse guard" in report) == (floor > 0)


def test_bfloat16_gradient_buffers_train_close_to_full_precision(tmp_path):
    """gradients.buffers=bfloat16 reaches the Gram step: each g_t rounded to bfloat16 moves the weights
    a little (so it was applied), the Gram still being accumulated in float32 keeps them close."""
    events = {}
    for buffers in ("full", "bfloat16"):
        out = tmp_path / buffers
        result = run_cli("--config", BASE_CONFIG, *lfmlf_run(out, 0, 16, **{"gradients.buffers": buffers}))
        assert result.returncode == 0, result.stderr[-3000:]
        events[buffers] = weighting_events(out)
    gaps = [
        abs(a[f"weight/xnli/{lang}"] - b[f"weight/xnli/{lang}"])
        for a, b in zip(events["full"], events["bfloat16"], strict=True)
        for lang in ("en", "de", "ar")
    ]
    assert 0 < max(gaps) < BFLOAT16_WEIGHT_GAP


# xnli en/ar and wikiann en, two rows a step: steps in which no row is wikiann's, so its head runs on no rows
HEADLESS_STEPS = 6
TWO_TASKS = {
    "data.tasks": "[{name: xnli, languages: [en, ar], protocol: in_language}, "
    "{name: wikiann, languages: [en], protocol: in_language}]",
    "data.sources.unimelb-nlp/wikiann": "tasks/wikiann/fixtures/wikiann",
    "training.micro_batch_size": 2,
    "evaluation.every_steps": None,
    "logging.every_steps": 1,
    "checkpointing.every_steps": HEADLESS_STEPS,
}
BUFFERLESS_MODES = {
    "tape": {"gradients.buffers": "none"},
    "backward": {"gradients.buffers": "none", "gradients.update": "backward"},
    "tape_checkpointed_chunked": {
        "gradients.buffers": "none",
        "gradients.chunk_mb": 0.05,
        "training.gradient_checkpointing": True,
    },
    "backward_checkpointed": {
        "gradients.buffers": "none",
        "gradients.update": "backward",
        "training.gradient_checkpointing": True,
    },
}


def test_steps_where_a_head_has_no_rows_in_every_bufferless_mode(tmp_path):
    """A multi-task run whose steps do not all reach every head trains in each bufferless way as with buffers: the
    same weights every step and the same model at the end (a head without rows once crashed the bufferless update)."""
    runs = {}
    for mode, options in {"full": {"gradients.buffers": "full"}, **BUFFERLESS_MODES}.items():
        out = tmp_path / mode
        result = run_cli("--config", BASE_CONFIG, *base_overrides(out, HEADLESS_STEPS, **TWO_TASKS, **options))
        assert result.returncode == 0, (mode, result.stderr[-3000:])
        runs[mode] = out
    train = [e for e in read_jsonl(runs["full"] / "metrics.jsonl") if e["kind"] == "train"]
    assert any(e["loss/wikiann/en"] is None for e in train) and any(e["loss/wikiann/en"] is not None for e in train)
    reference = weighting_events(runs["full"])
    names = ("weight/xnli/en", "weight/xnli/ar", "weight/wikiann/en")
    w0 = load_file(str(runs["full"] / f"checkpoints/step-{HEADLESS_STEPS:08d}/model.safetensors"))
    for mode in BUFFERLESS_MODES:
        events = weighting_events(runs[mode])
        assert len(events) == len(reference) == HEADLESS_STEPS, mode
        for a, b in zip(reference, events):
            for key in names:
                assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-7), (mode, a["step"], key)
        w1 = load_file(str(runs[mode] / f"checkpoints/step-{HEADLESS_STEPS:08d}/model.safetensors"))
        assert max((w0[k] - w1[k]).abs().max().item() for k in w0) < 1e-5, mode
