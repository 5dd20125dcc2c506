"""LF-MLF in AdamW's metric (``gradients.metric=optimizer``) and the first-order check of the applied update
(``gradients.descent_check``) through run.py and DeepSpeed: every step logs the certificate in the metric and
g_tᵀΔθ per objective, ZeRO 2 (partitioned optimizer state, one or two processes) reads the same metric as ZeRO 0,
the report and the study summary say how often the update decreased every objective, a weighting without a Gram
gets the check, and with SGD the metric is the Euclidean one."""

from __future__ import annotations

from pathlib import Path

import pytest

from mtft.study.collect import descent_summary
from tests.helpers.launch import run_cli, run_torchrun
from tests.helpers.runs import BASE_CONFIG, base_overrides, read_jsonl

STEPS = 6
LANGS = ("en", "de", "ar")


def adam_run(out: Path, zero: int = 0, **extra) -> list[str]:
    return base_overrides(
        out,
        STEPS,
        **{
            "training.deepspeed_config": f"configs/deepspeed/zero{zero}.json",
            "training.micro_batch_size": 16,
            "model.classifier_dropout": 0.0,
            "data.tasks.0.languages": "[en, de, ar]",
            "logging.every_steps": 1,
            "checkpointing.every_steps": None,
            "evaluation.every_steps": None,
            "gradients.metric": "optimizer",
            "gradients.descent_check": True,
            **extra,
        },
    )


def weighting_events(out: Path) -> list[dict]:
    return [e for e in read_jsonl(out / "metrics.jsonl") if e["kind"] == "weighting"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("adam")
    cases = {
        "zero0": adam_run(base / "zero0"),
        "zero2": adam_run(base / "zero2", zero=2),
        "mean": adam_run(base / "mean", **{"weighting.method": "mean", "gradients.metric": "euclidean"}),
        "sgd": adam_run(base / "sgd", **{"training.optimizer.name": "sgd", "gradients.descent_check": False}),
    }
    for name, overrides in cases.items():
        result = run_cli("--config", BASE_CONFIG, *overrides)
        assert result.returncode == 0, (name, result.stderr[-3000:])
    return {name: base / name for name in cases}


def test_every_step_logs_the_certificate_in_the_metric_and_the_descent_check(runs):
    events = weighting_events(runs["zero0"])
    assert [e["step"] for e in events] == list(range(1, STEPS + 1))
    # AdamW has no second moments before its first step: Euclidean then, its own metric from step 2 on
    assert [e["metric_preconditioned"] for e in events] == [0.0] + [1.0] * (STEPS - 1)
    for e in events:
        weights = [e[f"weight/xnli/{lang}"] for lang in LANGS]
        assert min(weights) >= 0 and sum(weights) == pytest.approx(1.0, abs=1e-9)
        # Theorem 2 in the metric: g_tᵀPd ≥ dᵀPd for every t
        assert e["theorem2"] >= -1e-8 * max(1.0, e["mean_grad_norm_sq"])
        changes = [e[f"first_order/xnli/{lang}"] for lang in LANGS]
        assert e["common_descent"] == float(max(changes) < 0)
        assert e["max_first_order"] == pytest.approx(max(changes))
        assert e["descent_fraction"] == pytest.approx(sum(c < 0 for c in changes) / 3)
    report = (runs["zero0"] / "report.md").read_text()
    assert "Gram in the optimizer's metric" in report
    assert "The Gram was formed in the optimizer's metric" in report and "First-order check" in report
    fraction = sum(e["common_descent"] for e in events) / STEPS
    assert descent_summary(runs["zero0"] / "metrics.jsonl") == {"common_descent": pytest.approx(fraction)}


def test_zero2_reads_the_partitioned_state_as_zero0(runs):
    """Same weights step by step: the metric read from ZeRO-2's partitioned fp32 state is ZeRO-0's."""
    for a, b in zip(weighting_events(runs["zero0"]), weighting_events(runs["zero2"]), strict=True):
        for lang in LANGS:
            assert a[f"weight/xnli/{lang}"] == pytest.approx(b[f"weight/xnli/{lang}"], rel=1e-3, abs=1e-5)
        assert a["d_norm_sq"] == pytest.approx(b["d_norm_sq"], rel=1e-3)


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_two_processes_under_zero2_read_the_same_metric(runs, tmp_path):
    """Each rank holds its own partition of AdamW's state; the assembled preconditioner, hence the weights, match
    the one-process run step by step."""
    out = tmp_path / "two"
    result = run_torchrun("--config", BASE_CONFIG, *adam_run(out, zero=2, **{"training.micro_batch_size": 8}))
    assert result.returncode == 0, result.stderr[-5000:]
    one, two = weighting_events(runs["zero2"]), weighting_events(out)
    assert [e["metric_preconditioned"] for e in two] == [0.0] + [1.0] * (STEPS - 1)
    assert all(e["gram_shards"] == 2 for e in two)  # the Gram in the metric and g_tᵀΔθ formed on shards
    # Measured on this machine (transformers 5.24, deepspeed 0.19.8): step 1 agrees to 2e-7; step 2, the first in
    # AdamW's metric, differs by 4.1e-3 relative and later steps by 1e-4 to 1.7e-3. After one step v̂ = g_1², so
    # P = 1/(√v̂ + ε) reaches 1/ε on coordinates where g_1 ≈ 0 and multiplies the 1-vs-2-process round-off of the
    # gradients there (the min-norm weights are not Lipschitz near a degenerate Gram: the drift issue 17 measures).
    for a, b in zip(one, two, strict=True):
        for lang in LANGS:
            assert a[f"weight/xnli/{lang}"] == pytest.approx(b[f"weight/xnli/{lang}"], rel=1e-2, abs=1e-5)
        assert a["common_descent"] == b["common_descent"]


def test_a_weighting_without_gram_gets_the_descent_check(runs):
    events = weighting_events(runs["mean"])
    assert len(events) == STEPS
    for e in events:
        assert all(e[f"weight/xnli/{lang}"] == pytest.approx(1 / 3) for lang in LANGS)
        assert "d_norm_sq" not in e and "common_descent" in e and "first_order/xnli/en" in e


def test_with_sgd_the_metric_is_euclidean(runs):
    events = weighting_events(runs["sgd"])
    assert len(events) == STEPS and all(e["metric_preconditioned"] == 0.0 for e in events)
    assert "first_order/xnli/en" not in events[0]  # descent_check off: nothing measured
    assert "applies no preconditioner" in (runs["sgd"] / "train.log").read_text()
