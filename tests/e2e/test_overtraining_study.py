"""The overtraining study's whole pipeline, reduced: the shipped configs/studies/overtraining.yaml with 2 budgets x
2 learning rates x 1 seed and short runs. Checks the bookkeeping, not the science: every budget is its own
pre-training whose schedule ends annealed to zero, every run names and logs its backbone's budget, and the study's
aggregates and the analysis's numbers equal the runs' own."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, clean_env, read_jsonl, run_process

BUDGETS = [1024, 4096]  # 2 and 8 steps of 16 x 32 tokens
LRS = [1.0e-3, 3.0e-3]
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("overtraining")
    spec = yaml.safe_load((REPO / "configs/studies/overtraining.yaml").read_text())
    spec["base"] = str(REPO / "configs/studies" / spec["base"])
    spec["grid"] = {"pretrain.tokens": BUDGETS, "training.optimizer.lr": LRS}
    spec["seeds"] = [0]
    spec["output_dir"] = str(folder / "study")
    spec["overrides"] = {
        "training.max_steps": 8,
        "checkpointing.every_steps": 8,
        "logging.every_steps": 4,
        "forgetting.every_steps": 4,
        "forgetting.eigen_iterations": 4,
        "forgetting.probe.gammas": [1.0, 3.0],
        "data.tasks.0.max_eval_examples": 20,
        "data.tasks.1.max_eval_examples": 20,
        "corpus.max_eval_examples": 16,
    }
    path = folder / "overtraining.yaml"
    path.write_text(yaml.safe_dump(spec))
    done = run_process(
        [sys.executable, "run.py", "study", "--config", str(path)],
        clean_env(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1"),
        timeout=280,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return folder / "study"


def runs(study: Path) -> dict[tuple[int, float], Path]:
    return {(b, lr): study / "runs" / f"tokens-{b}_lr-{lr}" / "seed-0" for b in BUDGETS for lr in LRS}


def test_every_budget_is_its_own_schedule_annealed_to_zero(finished):
    backbones = {}
    for (budget, _), run in runs(finished).items():
        (row,) = [r for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "backbone"]
        assert row["tokens_budget"] == budget and row["tokens_seen"] == budget
        assert row["steps"] == row["schedule_steps"] == budget // (16 * 32)  # the checkpoint ends its schedule
        assert row["lr_after"] == 0.0  # the scheduler's learning rate after the last step: annealed to zero
        report = (run / "report.md").read_text()
        assert f"| backbone pre-training | {budget:,} tokens of masked-LM pre-training" in report
        assert "the end of its own cosine schedule, learning rate 0 after it" in report
        backbones.setdefault(budget, set()).add(row["lp/en"])
    assert all(len(lp) == 1 for lp in backbones.values())  # the learning rates of a budget share its checkpoint
    assert backbones[BUDGETS[0]] != backbones[BUDGETS[1]]  # each budget its own pre-training (and cache entry)


def test_the_aggregates_and_the_analysis_equal_the_runs_numbers(finished):
    results = json.loads((finished / "results.json").read_text())
    analysis = json.loads((finished / "analyses/overtraining/inflection.json").read_text())
    cells = {c["name"]: c for c in results["cells"]}
    mean_curves = {json.dumps(i["group"]): i["mean_curve"] for i in analysis["inflections"]["lp_after"]}
    for (budget, lr), run in runs(finished).items():
        rows = read_jsonl(run / "metrics.jsonl")
        (eigen,) = [r for r in rows if r["kind"] == "lambda_p"]
        after = [r for r in rows if r["kind"] == "forgetting"][-1]
        probe = {r["gamma"]: r["dlp/mean/mean"] for r in rows if r["kind"] == "probe" and r["model"] == "pre-trained"}
        final = json.loads((run / "metrics.json").read_text())
        got = {m: s["mean"] for m, s in cells[f"tokens-{budget}_lr-{lr}"]["metrics"].items()}
        assert got["lp_before"] == pytest.approx(eigen["lp_pretrained/en"])
        assert got["lp_after"] == pytest.approx(after["lp/en"])
        assert got["lp_change"] == pytest.approx(after["lp/en"] - eigen["lp_pretrained/en"])
        assert got["lambda_p"] == pytest.approx(eigen["lambda_p"]) and got["distance"] == pytest.approx(
            after["distance"]
        )
        assert got["dlp_pretrained/g1"] == pytest.approx(probe[1.0]) and got["dlp_pretrained/g3"] == pytest.approx(
            probe[3.0]
        )
        assert got["xnli/accuracy"] == pytest.approx(final["xnli/accuracy"])
        assert got["wikiann/f1"] == pytest.approx(final["wikiann/f1"])
        assert got["pretrain_tokens"] == budget and got["pretrain_lr_after"] == 0.0
        curve = mean_curves[json.dumps({"training.optimizer.lr": lr})]
        assert curve[BUDGETS.index(budget)] == pytest.approx(after["lp/en"])
    assert [row["pretrain_lr_after"] for row in analysis["budgets"]] == [0.0, 0.0]
    study_md = (finished / "study.md").read_text()
    assert "## Overtraining: inflection points" in study_md
    for figure in ("a_lp_after.png", "b_probe.png", "c_lambda_p.png", "d1_xnli_accuracy.png", "d2_wikiann_f1.png"):
        assert (finished / "analyses/overtraining" / figure).stat().st_size > 0
        assert f"(analyses/overtraining/{figure})" in study_md
