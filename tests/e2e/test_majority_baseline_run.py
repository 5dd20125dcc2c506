"""A real run's metrics carry the majority-class baseline (mtft.evaluation.majority): the most frequent label of the
training splits it read, pooled over its languages, scored on each language's evaluation split, macro-averaged --
recomputed here from the fixture files themselves."""

from __future__ import annotations

import json
from collections import Counter
from statistics import mean

from tests.helpers.launch import REPO, run_cli
from tests.helpers.runs import BASE_CONFIG, base_overrides, read_jsonl

TRAIN, EVAL, LANGUAGES = 40, 30, ("en", "de")


def first_labels(language: str, split: str, count: int) -> list[int]:
    return [row["label"] for row in read_jsonl(REPO / f"tasks/xnli/fixtures/xnli/{language}/{split}.jsonl")[:count]]


def test_metrics_json_holds_the_majority_class_baseline_per_language_and_macro(tmp_path):
    out = tmp_path / "run"
    overrides = {
        "weighting.method": "mean",
        "weighting.options": {},
        "data.tasks": f"[{{name: xnli, languages: [{', '.join(LANGUAGES)}], protocol: in_language, "
        f"max_train_examples: {TRAIN}, max_eval_examples: {EVAL}}}]",
        "evaluation.every_steps": 2,
        "checkpointing.every_steps": None,
    }
    result = run_cli("--config", BASE_CONFIG, *base_overrides(out, 2, **overrides))
    assert result.returncode == 0, result.stderr[-3000:]
    pooled = Counter(label for lang in LANGUAGES for label in first_labels(lang, "train", TRAIN))
    majority = min(pooled, key=lambda label: (-pooled[label], label))  # a tie goes to the first label
    expected = {lang: first_labels(lang, "validation", EVAL).count(majority) / EVAL for lang in LANGUAGES}
    metrics = json.loads((out / "metrics.json").read_text())
    for lang, value in expected.items():
        assert abs(metrics[f"xnli/{lang}/majority_accuracy"] - value) < 1e-12, (lang, metrics)
    assert abs(metrics["xnli/majority_accuracy"] - mean(expected.values())) < 1e-12
    evals = [e for e in read_jsonl(out / "metrics.jsonl") if e["kind"] == "eval"]
    assert evals and all(e["xnli/majority_accuracy"] == metrics["xnli/majority_accuracy"] for e in evals)
    assert f"| majority-class baseline (macro) | {mean(expected.values()):.4f} |" in (out / "report.md").read_text()
