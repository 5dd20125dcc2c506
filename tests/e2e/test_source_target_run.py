"""A multi-source run (issue 29): XNLI fixtures trained on two source languages and evaluated on two more targets.

Its own run, the smallest that shows it (4 steps of the e2e base, 40 training and 20 evaluation examples per
language): no other e2e module trains with ``source_languages``, and what is checked -- the losses logged per
objective, the macros written by a real evaluation, the report's table, the selection's key -- comes from the
trainer itself, which the unit tests (tests/unit/data/test_source_languages.py) call piece by piece only."""

from __future__ import annotations

import json

from tests.helpers.launch import run_cli
from tests.helpers.runs import BASE_CONFIG, base_overrides, read_jsonl


def test_a_two_source_two_target_run_reports_source_and_target_macros_and_the_gap(tmp_path):
    out = tmp_path / "run"
    overrides = {
        "weighting.method": "mean",
        "weighting.options": {},
        "data.tasks": "[{name: xnli, languages: [en, de, ar, zh], source_languages: [en, de], protocol: in_language, "
        "max_train_examples: 40, max_eval_examples: 20}]",
        "evaluation.every_steps": 2,
        "checkpointing.every_steps": None,
    }
    result = run_cli("--config", BASE_CONFIG, *base_overrides(out, 4, **overrides))
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["languages"] == {"xnli": {"source": ["en", "de"], "target": ["ar", "zh"]}}
    per = {lang: metrics[f"xnli/{lang}/accuracy"] for lang in ("en", "de", "ar", "zh")}
    source, target = (per["en"] + per["de"]) / 2, (per["ar"] + per["zh"]) / 2
    assert abs(metrics["xnli/source_accuracy"] - source) < 1e-12
    assert abs(metrics["xnli/target_accuracy"] - target) < 1e-12
    assert abs(metrics["xnli/transfer_gap_accuracy"] - (source - target)) < 1e-12
    rows = read_jsonl(out / "metrics.jsonl")
    trained = {k for row in rows if row["kind"] == "train" for k in row if k.startswith("loss/")}
    assert trained == {"loss/xnli/en", "loss/xnli/de"}  # no target ever has a loss
    report = (out / "report.md").read_text()
    for row in ("| en (source) |", "| zh (target) |", "| source macro |", "| transfer gap (source − target) |"):
        assert row in report
    assert f"| target macro | {target:.4f} |" in report
    # metric_for_best xnli/accuracy (the base's) read on the sources only (evaluation.select_on's default)
    assert "`xnli/source_accuracy` = " in report
