"""A run's record: metrics.json numbers, worst languages, forgetting summaries from the log, a torn last line."""

from __future__ import annotations

import json

from mtft.study.collect import descent_summary, forgetting_summaries, run_metrics, worst_languages


def test_worst_language_per_task_metric():
    metrics = {"xnli/en/accuracy": 0.9, "xnli/sw/accuracy": 0.6, "xnli/accuracy": 0.75, "ner/en/f1": 0.5}
    assert worst_languages(metrics) == {"xnli/worst_accuracy": 0.6, "ner/worst_f1": 0.5}


def test_forgetting_summaries_final_and_max_per_suffix(tmp_path):
    rows = [
        {"step": 50, "kind": "forgetting", "F_p": 0.5, "F_p/en": 0.2, "distance": 1.0, "bound_path": 3.0},
        {"step": 60, "kind": "train", "loss": 1.0, "distance": 99.0},
        {"step": 100, "kind": "forgetting", "F_p": 0.3, "F_p/en": 0.4, "distance": 2.0, "bound_path": 4.0},
        {"step": 100, "kind": "displacement", "distance/xnli": 5.0},
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + '\n{"step": 150, "kind": "forg', encoding="utf-8")
    assert forgetting_summaries(path) == {
        "F_p_final": 0.3,
        "F_p_max": 0.5,
        "F_p_final/en": 0.4,
        "F_p_max/en": 0.4,
        "distance": 2.0,
        "bound_path": 4.0,
        "distance/xnli": 5.0,
    }


def test_forgetting_summaries_carry_retrieval_at_theta_p_and_at_the_last_measurement(tmp_path):
    """The retrieval monitor's numbers (mtft.forgetting.monitor: θ_p's in the lambda_p row, then each forgetting
    row's) reach a study's records: the zero-shot study's retrieval_drop is one of them."""
    rows = [
        {
            "step": 0,
            "kind": "lambda_p",
            "lambda_p": 2.0,
            "retrieval_pretrained": 0.5,
            "retrieval_pretrained/en-de": 0.6,
        },
        {
            "step": 50,
            "kind": "forgetting",
            "F_p": 0.1,
            "retrieval": 0.45,
            "retrieval/en-de": 0.5,
            "retrieval_drop": 0.05,
        },
        {"step": 60, "kind": "train", "retrieval": 0.0, "retrieval_drop": 9.0},  # not a forgetting row
        {
            "step": 100,
            "kind": "forgetting",
            "F_p": 0.2,
            "retrieval": 0.4,
            "retrieval/en-de": 0.3,
            "retrieval_drop": 0.1,
        },
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    summaries = forgetting_summaries(path)
    assert {k: v for k, v in summaries.items() if k.startswith("retrieval")} == {
        "retrieval_pretrained": 0.5,
        "retrieval_pretrained/en-de": 0.6,
        "retrieval": 0.4,
        "retrieval/en-de": 0.3,
        "retrieval_drop": 0.1,
    }
    assert "lambda_p" not in summaries


def test_run_metrics_leave_the_step_out_and_keep_nan(tmp_path):
    (tmp_path / "metrics.json").write_text('{"step": 10, "xnli/accuracy": NaN, "xnli/en/accuracy": 0.5, "name": "x"}')
    metrics = run_metrics(tmp_path)
    assert set(metrics) == {"xnli/accuracy", "xnli/en/accuracy", "xnli/worst_accuracy"}
    assert metrics["xnli/accuracy"] != metrics["xnli/accuracy"]  # NaN: counted apart by the aggregation


def test_descent_summary_is_the_fraction_of_checked_steps(tmp_path):
    rows = [
        {"step": 1, "kind": "weighting", "common_descent": 1.0},
        {"step": 2, "kind": "weighting", "common_descent": 0.0},
        {"step": 2, "kind": "train", "common_descent": 1.0},  # not a weighting row
        {"step": 3, "kind": "weighting", "common_descent": 1.0},
        {"step": 4, "kind": "weighting", "weight/xnli/en": 1.0},  # a step without the check
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + '\n{"step": 5, "kind": "weigh', encoding="utf-8")
    assert descent_summary(path) == {"common_descent": 2 / 3}
    path.write_text(json.dumps(rows[-1]), encoding="utf-8")
    assert descent_summary(path) == {}  # a run without descent_check has no summary


def test_source_and_target_macros_are_study_metrics(tmp_path):
    """A run with target languages (mtft.evaluation.evaluate.add_macro_averages) writes two-part macro names, so a
    study aggregates them by key, counts failures against their majority baseline, and its per-language views
    (worst language, families) see languages only; the roles mapping is not a number and stays out."""
    from mtft.study.aggregate import expand_metrics, is_per_objective
    from mtft.study.failure import expand_failure_metrics

    final = {
        "step": 10,
        "xnli/en/accuracy": 0.9,
        "xnli/sw/accuracy": 0.5,
        "xnli/accuracy": 0.7,
        "xnli/source_accuracy": 0.9,
        "xnli/target_accuracy": 0.5,
        "xnli/transfer_gap_accuracy": 0.4,
        "xnli/majority_target_accuracy": 0.33,
        "languages": {"xnli": {"source": ["en"], "target": ["sw"]}},
    }
    (tmp_path / "metrics.json").write_text(json.dumps(final))
    metrics = run_metrics(tmp_path)
    assert "languages" not in metrics and metrics["xnli/worst_accuracy"] == 0.5
    names, unmatched = expand_metrics(["xnli/target_*", "xnli/transfer_gap_accuracy"], set(metrics))
    assert names == ["xnli/target_accuracy", "xnli/transfer_gap_accuracy"] and not unmatched
    assert not any(is_per_objective(name) for name in names)
    counted, _, without = expand_failure_metrics(["xnli/target_accuracy"], set(metrics))
    assert counted == ["xnli/target_accuracy"] and not without
