"""The overtraining analysis (mtft/study/overtraining.py): a run's numbers from its log, the bookkeeping table, the
section of study.md and the figures, on hand-written logs and records."""

from __future__ import annotations

import json

import pytest

from mtft.study.aggregate import aggregate, run_record
from mtft.study.overtraining import (
    OvertrainingAnalysis,
    budget_table,
    draw_figures,
    one_per_backbone,
    run_measures,
    sensitivity_trends,
)

AXIS, LR = "pretrain.tokens", "training.optimizer.lr"


def test_a_runs_measures_come_from_its_own_log(tmp_path):
    rows = [
        {
            "step": 0,
            "kind": "backbone",
            "tokens_budget": 4096,
            "steps": 8,
            "schedule_steps": 8,
            "lr_after": 0.0,
            "seed": 3,
        },
        {"step": 0, "kind": "lambda_p", "lambda_p": 12.5, "lp_pretrained/en": 3.0, "lp_pretrained/de": 4.0},
        {"step": 20, "kind": "train", "loss": 1.0, "loss/xnli": 1.5, "loss/wikiann": 0.5, "lr": 1e-3},
        {"step": 20, "kind": "forgetting", "lp/en": 9.0, "lp/de": 9.0, "F_p": 5.5},
        {"step": 40, "kind": "train", "loss": 0.7, "loss/xnli/en": 0.9, "loss/wikiann": 0.4, "lr": 0.0},
        {"step": 40, "kind": "forgetting", "lp/en": 3.5, "lp/de": 4.5, "lp/xnli/en": 99.0, "F_p": 0.5},
        {"step": 40, "kind": "probe", "model": "pre-trained", "gamma": 0.3, "dlp/mean/mean": 0.01},
        {"step": 40, "kind": "probe", "model": "pre-trained", "gamma": 1.0, "dlp/mean/mean": 0.2},
        {"step": 40, "kind": "probe", "model": "fine-tuned", "gamma": 1.0, "dlp/mean/mean": 0.4},
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + '\n{"step": 41, "kind": "tr', encoding="utf-8")
    assert run_measures(path) == {
        "pretrain_tokens": 4096.0,
        "pretrain_lr_after": 0.0,
        "pretrain_seed": 3.0,  # the backbone's own seed (pretrain.seed)
        "pretrain_schedule_left": 0.0,
        "lambda_p": 12.5,
        "lp_before": 3.5,
        "lp_after": 4.0,  # the last forgetting row, one adapter's languages only
        "lp_change": 0.5,
        "task_loss/xnli.en": 0.9,  # the last train row
        "task_loss/wikiann": 0.4,
        "dlp_pretrained/g0.3": 0.01,
        "dlp_pretrained/g1": 0.2,
        "dlp_finetuned/g1": 0.4,
    }
    assert run_measures(tmp_path / "absent.jsonl") == {}


def records() -> list[dict]:
    """2 learning rates x 3 budgets x 2 seeds; at lr 1e-3 L_p after fine-tuning is lowest at 2000 tokens."""
    out = []
    lp = {1e-3: [3.0, 2.0, 2.6], 1e-4: [3.0, 2.5, 2.2]}
    for lr, curve in lp.items():
        for seed in (0, 1):
            for budget, value in zip((1000, 2000, 4000), curve):
                metrics = {
                    "lp_after": value + 0.01 * seed,
                    "lp_before": 4.0 - budget / 1000,
                    "lambda_p": budget / 100,
                    "xnli/accuracy": 0.5 + budget / 10000,
                    "pretrain_tokens": float(budget),
                    "pretrain_lr_after": 0.0,
                    "pretrain_schedule_left": 0.0,
                    "dlp_pretrained/g1": budget / 1e4,
                    "dlp_pretrained/g0.3": budget / 1e5,
                }
                out.append(run_record(f"tokens-{budget}_lr-{lr}", {AXIS: budget, LR: lr}, seed, metrics=metrics))
    out.append(run_record("tokens-4000_lr-0.001", {AXIS: 4000, LR: 1e-3}, 2, status="failed", error="boom"))
    return out


def test_budget_table_is_the_bookkeeping_of_each_budget():
    table = budget_table([r for r in records() if r["status"] == "complete"], AXIS)
    assert [row["budget"] for row in table] == [1000, 2000, 4000]
    assert [row["backbone_tokens"] for row in table] == [[1000.0], [2000.0], [4000.0]]
    assert all(row["pretrain_lr_after"] == 0.0 and row["runs"] == 4 and row["backbones"] == 1 for row in table)
    assert [row["lambda_p"] for row in table] == pytest.approx([10, 20, 40])


def test_the_analysis_writes_inflections_figures_and_its_section(tmp_path):
    analysis = OvertrainingAnalysis({"task_metrics": ["xnli/accuracy"]})
    data = records()
    cells = sorted({r["cell"] for r in data})
    results = aggregate(data, [AXIS, LR], ["*"], None, cells)
    lines = analysis.write(tmp_path, "analyses/overtraining", data, results)
    saved = json.loads((tmp_path / "inflection.json").read_text())
    points = {json.dumps(i["group"]): i["point"] for i in saved["inflections"]["lp_after"]}
    assert points == {json.dumps({LR: 1e-3}): 2000, json.dumps({LR: 1e-4}): None}
    assert all(i["point"] is None for i in saved["inflections"]["xnli/accuracy"])  # rises with the budget
    assert {p.name for p in tmp_path.glob("*.png")} == {
        "a_lp_after.png",
        "b_probe.png",
        "c_lambda_p.png",
        "d1_xnli_accuracy.png",
    }
    text = "\n".join(lines)
    assert "| lp_after | lr=0.001 | 2,000 (per seed 0: 2,000, 1: 2,000; all seeds agree) |" in text
    assert "| lp_after | lr=0.0001 | none within the budgets tried" in text
    assert "| lambda_p | 3 | +1.00 (0) | 1,000 | +1.00 (0, 3) |" in text  # one model per budget, rising
    assert (
        "![(a) pre-training loss L_p after fine-tuning against the budget](analyses/overtraining/a_lp_after.png)"
        in text
    )


def test_a_pre_trained_models_numbers_count_once_per_backbone():
    """Runs fine-tuning the same backbone repeat its λ_p and ΔL_p(θ_p): the spread over budgets' backbones is taken
    over one run per (budget, backbone seed), not over the repeats."""
    complete = [r for r in records() if r["status"] == "complete"]
    assert len(one_per_backbone(complete, AXIS)) == 3  # no backbone seed logged: one backbone per budget
    for r in complete:  # every seed its own backbone (seed_keys: [run.seed, pretrain.seed])
        r["metrics"]["pretrain_seed"] = float(r["seed"])
    kept = one_per_backbone(complete, AXIS)
    assert sorted((r["axes"][AXIS], r["seed"]) for r in kept) == [(b, s) for b in (1000, 2000, 4000) for s in (0, 1)]
    assert [row["backbones"] for row in budget_table(complete, AXIS)] == [2, 2, 2]


def test_two_other_axes_draw_one_panel_per_level_of_the_first(tmp_path):
    import matplotlib.image

    plain = [r for r in records() if r["status"] == "complete"]
    (tmp_path / "one").mkdir()
    draw_figures(tmp_path / "one", plain, AXIS, ["xnli/accuracy"])
    factored = []
    for level in ("none", "l2-1"):
        for r in plain:
            factored.append({**r, "axes": {"regularization": level, **r["axes"]}})
    (tmp_path / "two").mkdir()
    draw_figures(tmp_path / "two", factored, AXIS, ["xnli/accuracy"])
    for name in ("a_lp_after.png", "d1_xnli_accuracy.png"):
        one = matplotlib.image.imread(tmp_path / "one" / name)
        two = matplotlib.image.imread(tmp_path / "two" / name)
        assert one.shape[0] == two.shape[0] and two.shape[1] == 2 * one.shape[1]  # two panels side by side
    assert (
        matplotlib.image.imread(tmp_path / "two" / "b_probe.png").shape
        == matplotlib.image.imread(tmp_path / "one" / "b_probe.png").shape
    )  # a pre-trained model's numbers: one panel


def test_progressive_sensitivity_is_a_rank_correlation_over_pre_trained_models():
    """One point per pre-trained model; 'from_lowest' starts where the mean is lowest (a U-shaped curve rises
    after its minimum while the whole range shows no trend)."""
    u_shape = {1000: 0.5, 2000: 0.2, 4000: 0.1, 8000: 0.3, 16000: 0.6}
    data = []
    for budget, value in u_shape.items():
        for backbone in (0, 1):
            for lr in (1e-3, 1e-4):  # two runs of each model: counted once
                metrics = {"pretrain_seed": float(backbone), "dlp_pretrained/g1": value + 0.01 * backbone}
                data.append(run_record(f"tokens-{budget}_lr-{lr}", {AXIS: budget, LR: lr}, backbone, metrics=metrics))
    (trend,) = sensitivity_trends(data, AXIS)
    assert trend["measure"] == "dlp_pretrained/g1" and trend["models"] == 10 and trend["lowest_mean_at"] == 4000
    assert trend["from_lowest"]["points"] == 6 and trend["from_lowest"]["rho"] == pytest.approx(0.956, abs=1e-3)
    assert abs(trend["all"]["rho"]) < 0.3 and trend["all"]["p_value"] > 0.3
