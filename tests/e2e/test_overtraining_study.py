"""The overtraining study's whole pipeline, reduced: the shipped configs/studies/overtraining.yaml with 2 budgets x
2 learning rates x 1 seed and short runs, the regularisation towards θ_p at one of the learning rates. Checks the
bookkeeping, not the science: every budget is its own pre-training whose schedule ends annealed to zero, every run
names and logs its backbone's budget, the backbone's seed is the run's seed, and the study's aggregates, paired
differences and the analysis's numbers equal the runs' own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.helpers.launch import REPO, launch_cli
from tests.helpers.runs import read_jsonl
from tests.helpers.study import study_failure

BUDGETS = [1024, 4096]  # 2 and 8 steps of 16 x 32 tokens
LRS = [1.0e-3, 3.0e-3]
SEED = 1  # seed_keys: the backbone's seed (pretrain.seed) is the run's seed too
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("overtraining")
    spec = yaml.safe_load((REPO / "configs/studies/overtraining.yaml").read_text())
    spec["base"] = str(REPO / "configs/studies" / spec["base"])
    spec["grid"] = {"pretrain.tokens": BUDGETS, "training.optimizer.lr": LRS}
    spec["seeds"] = [SEED]
    # the regularised level at the larger learning rate only: 6 runs, not 8
    spec["exclude"] = [{"regularization": "l2-1", "training.optimizer.lr": LRS[0]}]
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
    done = launch_cli(  # forked from the warm Python, as its runs then are (a study launched cold starts them cold)
        "study",
        "--config",
        str(path),
        timeout=280,
        processes=2,  # the study's two local workers
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
    )
    assert done.returncode == 0, study_failure(done, folder / "study")
    return folder / "study"


def runs(study: Path, level: str = "none") -> dict[tuple[int, float], Path]:
    lrs = LRS if level == "none" else LRS[1:]
    return {(b, lr): study / "runs" / f"{level}_tokens-{b}_lr-{lr}" / f"seed-{SEED}" for b in BUDGETS for lr in lrs}


def test_every_budget_is_its_own_schedule_annealed_to_zero(finished):
    backbones = {}
    for (budget, _), run in {**runs(finished), **runs(finished, "l2-1")}.items():
        assert yaml.safe_load((run / "config.yaml").read_text())["pretrain"]["seed"] == SEED
        (row,) = [r for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "backbone"]
        assert row["tokens_budget"] == budget and row["tokens_seen"] == budget
        assert row["steps"] == row["schedule_steps"] == budget // (16 * 32)  # the checkpoint ends its schedule
        assert row["lr_after"] == 0.0  # the scheduler's learning rate after the last step: annealed to zero
        report = (run / "report.md").read_text()
        assert f"| backbone pre-training | {budget:,} tokens of masked-LM pre-training" in report
        assert "the end of its own cosine schedule, learning rate 0 after it" in report
        backbones.setdefault(budget, set()).add(row["lp/en"])
    assert all(len(lp) == 1 for lp in backbones.values())  # a budget's runs share its checkpoint
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
        got = {m: s["mean"] for m, s in cells[f"none_tokens-{budget}_lr-{lr}"]["metrics"].items()}
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
        curve = mean_curves[json.dumps({"regularization": "none", "training.optimizer.lr": lr})]
        assert curve[BUDGETS.index(budget)] == pytest.approx(after["lp/en"])
    assert [row["pretrain_lr_after"] for row in analysis["budgets"]] == [0.0, 0.0]
    assert len(mean_curves) == 3  # (none, both learning rates) and (l2-1, the larger)
    study_md = (finished / "study.md").read_text()
    assert "## Overtraining: inflection points" in study_md
    for figure in ("a_lp_after.png", "b_probe.png", "c_lambda_p.png", "d1_xnli_accuracy.png", "d2_wikiann_f1.png"):
        assert (finished / "analyses/overtraining" / figure).stat().st_size > 0
        assert f"(analyses/overtraining/{figure})" in study_md


def test_the_regularisation_is_applied_and_paired_with_its_unregularised_twin(finished):
    """The penalty λ||θ − θ_p||² (λ = 1) is in the regularised runs' loss only, and the study's paired difference
    (regularised − none, same budget, learning rate and seed) is the two runs' own difference."""
    results = json.loads((finished / "results.json").read_text())
    for (budget, lr), run in runs(finished, "l2-1").items():
        twin = runs(finished)[budget, lr]
        assert yaml.safe_load((run / "config.yaml").read_text())["forgetting"]["regularization"] == 1.0
        assert yaml.safe_load((twin / "config.yaml").read_text())["forgetting"]["regularization"] == 0.0
        mine, theirs = (_final(r) for r in (run, twin))
        assert mine["distance"] < theirs["distance"]  # pulled towards θ_p
        for metric in ("distance", "wikiann/f1"):
            (diff,) = [
                d
                for d in results["differences"]
                if d["cell"] == f"l2-1_tokens-{budget}_lr-{lr}" and d["metric"] == metric
            ]
            assert diff["baseline_cell"] == f"none_tokens-{budget}_lr-{lr}" and diff["seeds"] == [SEED]
            assert diff["mean"] == pytest.approx(mine[metric] - theirs[metric])


def _final(run: Path) -> dict[str, float]:
    """The run's final task metrics and its last ||θ_f − θ_p|| (from its last forgetting row)."""
    last = [r for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "forgetting"][-1]
    return {**json.loads((run / "metrics.json").read_text()), "distance": last["distance"]}
