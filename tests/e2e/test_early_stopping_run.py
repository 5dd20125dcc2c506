"""Early stopping end to end (evaluation.early_stopping_patience): with a learning rate too small to change a
prediction, the metric never improves after the first evaluation, so the run stops after exactly ``patience`` more
evaluations, logs why, keeps the best step in best/, and still evaluates and reports at the end; resumed, it trains
no further. With data.dev_split the evaluations during training score the dev set, and the test set is scored once."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers.launch import run_cli
from tests.helpers.runs import BASE_CONFIG, base_overrides, read_jsonl

PATIENCE, EVERY, MAX_STEPS = 2, 2, 40


def expected_stop(values: list[float], patience: int) -> int:
    """Index of the evaluation at which ``patience`` consecutive evaluations have not beaten the best (ties do not)."""
    best, without = None, 0
    for index, value in enumerate(values):
        if best is None or value > best:
            best, without = value, 0
        else:
            without += 1
        if without >= patience:
            return index
    raise AssertionError(f"no early stop in {values}")


OVERRIDES = {
    "weighting.method": "mean",
    "weighting.options": {},
    "training.optimizer.lr": 1e-12,  # the weights barely move: accuracy is the same at every evaluation
    "training.scheduler.warmup_ratio": 0.0,
    "data.tasks": "[{name: xnli, languages: [en], protocol: in_language, max_train_examples: 64, "
    "max_eval_examples: 32}]",
    "evaluation.every_steps": EVERY,
    "evaluation.early_stopping_patience": PATIENCE,
    "checkpointing.every_steps": None,
    "logging.every_steps": 1,
}


def test_a_run_stops_after_patience_evaluations_without_improvement(tmp_path: Path):
    out = tmp_path / "run"
    result = run_cli("--config", BASE_CONFIG, *base_overrides(out, MAX_STEPS, **OVERRIDES))
    assert result.returncode == 0, result.stderr[-3000:]
    events = read_jsonl(out / "metrics.jsonl")
    evals = [e for e in events if e["kind"] == "eval"]
    during, final = evals[:-1], evals[-1]
    stop_index = expected_stop([e["xnli/accuracy"] for e in during], PATIENCE)
    assert stop_index == len(during) - 1  # no evaluation after the one that stopped the run
    stop_step = during[stop_index]["step"]
    assert stop_step == EVERY * (PATIENCE + 1) < MAX_STEPS  # the metric is constant: the first evaluation is the best
    [stopped] = [e for e in events if e["kind"] == "stopped"]
    assert stopped["reason"] == "early_stopping" and stopped["step"] == stop_step
    assert max(e["step"] for e in events if e["kind"] == "train") == stop_step  # not one step more
    best_values = [e["xnli/accuracy"] for e in during]
    best_step = during[best_values.index(max(best_values))]["step"]  # the first of equal values
    assert json.loads((out / "best/metrics.json").read_text())["step"] == best_step == stopped["best_step"]
    assert final["step"] == stop_step  # the final evaluation still ran, at the step training stopped
    assert json.loads((out / "metrics.json").read_text())["step"] == stop_step and (out / "report.md").is_file()
    assert "stopping early" in (out / "train.log").read_text()
    # resumed, the stopped run trains no further: the count of evaluations without improvement is in the checkpoint
    resumed = run_cli("--config", BASE_CONFIG, *base_overrides(out, MAX_STEPS, **OVERRIDES), "run.resume=true")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [(e["step"], e["kind"]) for e in read_jsonl(out / "metrics.jsonl")] == [
        (e["step"], e["kind"]) for e in events
    ]


def test_with_a_dev_split_selection_scores_the_dev_set_and_the_final_evaluation_the_test_set(tmp_path: Path):
    out = tmp_path / "run"
    overrides = {**OVERRIDES, "data.dev_split": 0.25}
    result = run_cli("--config", BASE_CONFIG, *base_overrides(out, MAX_STEPS, **overrides))
    assert result.returncode == 0, result.stderr[-3000:]
    events = read_jsonl(out / "metrics.jsonl")
    dev = [e for e in events if e["kind"] == "dev"]
    test = [e for e in events if e["kind"] == "eval"]
    stop_step = EVERY * (PATIENCE + 1)
    assert [e["step"] for e in dev] == list(range(EVERY, stop_step + 1, EVERY))  # the stop step scored once
    assert [e["step"] for e in test] == [stop_step]  # the test set: once, at the end
    [stopped] = [e for e in events if e["kind"] == "stopped"]
    assert stopped["reason"] == "early_stopping" and stopped["step"] == stop_step
    best = json.loads((out / "best/metrics.json").read_text())
    assert best == {"step": EVERY, **{k: v for k, v in dev[0].items() if k not in ("step", "kind")}}
    final = json.loads((out / "metrics.json").read_text())
    assert final == {"step": stop_step, **{k: v for k, v in test[0].items() if k not in ("step", "kind")}}
    assert len((out / "predictions/validation/xnli/en.jsonl").read_text().splitlines()) == 32  # the whole test set
    assert "| xnli/en | 48 |" in (out / "report.md").read_text()  # trained on 48 of the 64 examples
