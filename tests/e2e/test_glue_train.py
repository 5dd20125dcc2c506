"""Short training runs on the GLUE/SuperGLUE fixtures: the regression head (STS-B), the multiple-choice head
(COPA) and a grouped task (MultiRC) learn, and `run.py score` re-scores the run's predictions files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtft.commands import run_command
from tests.helpers.launch import REPO, run_cli
from tests.helpers.runs import BASE_CONFIG, base_overrides, read_jsonl

FIXTURES = {"nyu-mll/glue": "tasks/glue/fixtures/glue", "aps/super_glue": "tasks/super_glue/fixtures/super_glue"}
# the base run (full fine-tuning of the tiny encoder, dropout 0) on the GLUE/SuperGLUE fixtures, mean weighting
GLUE_RUN = {
    "run.seed": 3,
    "model.tiny.vocab_size": 1000,
    "weighting.method": "mean",
    "training.optimizer.lr": 2e-3,
    "data.tasks": [{"name": "glue_stsb"}, {"name": "superglue_copa"}, {"name": "superglue_multirc"}],
    "data.sources": FIXTURES,
    "evaluation.every_steps": 150,
    "evaluation.metric_for_best": None,
    "checkpointing.every_steps": None,
    "logging.every_steps": 50,
}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("glue_run") / "out"
    result = run_cli("--config", BASE_CONFIG, *base_overrides(out, 150, **GLUE_RUN))
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_regression_head_learns_stsb(run):
    metrics = json.loads((run / "metrics.json").read_text())
    # a constant or random predictor has correlation ~0; the score is 5 minus the replaced slots
    assert metrics["glue_stsb/en/pearson"] > 0.8 and metrics["glue_stsb/en/spearman"] > 0.8, metrics
    predictions = read_jsonl(run / "predictions/validation/glue_stsb/en.jsonl")
    assert len(predictions) == 150 and all(isinstance(p["prediction"], float) for p in predictions)


def test_multiple_choice_head_learns_copa(run):
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["superglue_copa/accuracy"] > 0.7, metrics  # chance: 0.5
    predictions = read_jsonl(run / "predictions/validation/superglue_copa/en.jsonl")
    assert len(predictions) == 100 and {p["prediction"] for p in predictions} == {"choice1", "choice2"}


def test_grouped_task_learns_multirc(run):
    metrics = json.loads((run / "metrics.json").read_text())
    # all-False and all-True both score EM 0 (every question has a right and a wrong option)
    assert metrics["superglue_multirc/exact_match"] > 0.15 and metrics["superglue_multirc/f1a"] > 0.4, metrics
    predictions = read_jsonl(run / "predictions/validation/superglue_multirc/en.jsonl")
    assert predictions[0]["id"] == "0-0-0" and {p["prediction"] for p in predictions} <= {"True", "False"}
    heads = json.loads((run / "checkpoints/step-00000150/heads.json").read_text())
    assert heads == {
        "glue_stsb": {"kind": "regression", "label_names": []},
        "superglue_copa": {"kind": "multiple_choice", "label_names": ["choice1", "choice2"]},
        "superglue_multirc": {"kind": "sequence_classification", "label_names": ["False", "True"]},
    }


@pytest.mark.parametrize(
    "task, config_key",
    [("glue_stsb", "nyu-mll/glue"), ("superglue_multirc", "aps/super_glue"), ("superglue_copa", "aps/super_glue")],
)
def test_score_reproduces_the_runs_metrics(run, task, config_key, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    argv = [
        "--task",
        task,
        "--predictions",
        str(run / f"predictions/validation/{task}/en.jsonl"),
        "--references",
        FIXTURES[config_key],
    ]
    assert run_command("score", argv) == 0  # in-process: what `python run.py score ...` runs
    scored = json.loads(capsys.readouterr().out)
    metrics = json.loads((run / "metrics.json").read_text())
    for name in {
        "glue_stsb": ["pearson", "spearman"],
        "superglue_multirc": ["exact_match", "f1a"],
        "superglue_copa": ["accuracy"],
    }[task]:
        assert scored[name] == pytest.approx(metrics[f"{task}/en/{name}"], abs=1e-9)
