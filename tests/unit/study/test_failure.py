"""The failed-run rate (Mosbach et al., 2021): runs at or below the majority-class baseline they report, per cell,
from the study file's `failure` metrics to results.json, results.csv and study.md; bad `failure` entries refused."""

from __future__ import annotations

import csv
import io
import json
import math

import pytest

from mtft.core.errors import ConfigError
from mtft.study.aggregate import aggregate, run_record
from mtft.study.failure import baseline_of, expand_failure_metrics, failure_rate
from mtft.study.report import results_csv, write_results
from tests.helpers.study import plan, write_study


def runs(values: list, baselines: list, statuses=None) -> list[dict]:
    """Run records of one cell, seed i with rte/accuracy = values[i], rte/majority_accuracy = baselines[i]."""
    records = []
    for seed, (value, reference) in enumerate(zip(values, baselines)):
        metrics = {k: v for k, v in (("rte/accuracy", value), ("rte/majority_accuracy", reference)) if v is not None}
        status = statuses[seed] if statuses else "complete"
        records.append(run_record("c", {"variant": "c"}, seed, status, metrics if status == "complete" else {}))
    return records


@pytest.mark.parametrize(
    "values, baselines, statuses, failed, scored, seeds",
    [
        ([0.7, 0.5, 0.52, 0.8], [0.52] * 4, None, 2, 4, [1, 2]),  # below, and exactly at the baseline, fail
        ([0.9, 0.9], [0.52, 0.52], None, 0, 2, []),
        ([0.4, 0.4, 0.4], [0.5, 0.5, 0.5], None, 3, 3, [0, 1, 2]),
        # a run's own baseline counts (its data may differ): 0.6 fails against 0.6, passes against 0.5
        ([0.6, 0.6], [0.6, 0.5], None, 1, 2, [0]),
        # NaN or missing on either side, or a run not complete: not scored
        ([math.nan, 0.3, 0.3, None, 0.9], [0.5, math.nan, None, 0.5, 0.5], None, 0, 1, []),
        ([0.3, 0.3, 0.3], [0.5] * 3, ["complete", "failed", "pending"], 1, 1, [0]),
        # a macro average that equals the baseline up to float rounding fails
        ([(0.1 + 0.2) / 3], [0.3 / 3], None, 1, 1, [0]),
    ],
)
def test_failure_rate_counts_complete_runs_at_or_below_their_own_baseline(
    values, baselines, statuses, failed, scored, seeds
):
    rate = failure_rate(runs(values, baselines, statuses), "rte/accuracy")
    assert (rate.failed, rate.scored, rate.failed_seeds) == (failed, scored, seeds)
    assert rate.baseline == "rte/majority_accuracy" and rate.rate == (failed / scored if scored else None)


def test_no_scored_run_has_no_rate_and_no_baseline_mean():
    rate = failure_rate(runs([None], [0.5]), "rte/accuracy")
    assert (rate.scored, rate.rate, rate.baseline_mean) == (0, None, None)


def test_each_metric_is_paired_with_its_majority_counterpart_and_patterns_never_count_a_baseline():
    assert baseline_of("rte/accuracy") == "rte/majority_accuracy"
    assert baseline_of("xnli/de/accuracy") == "xnli/de/majority_accuracy"
    available = {
        "rte/accuracy",
        "rte/majority_accuracy",
        "xnli/accuracy",
        "xnli/majority_accuracy",
        "xnli/de/accuracy",
        "xnli/de/majority_accuracy",
        "tydiqa/f1",
        "wall_s",
    }
    counted, unmatched, without = expand_failure_metrics(["*accuracy", "tydiqa/*", "cola/mcc"], available)
    assert counted == ["rte/accuracy", "xnli/accuracy", "xnli/de/accuracy"]  # pattern order, sorted within
    assert unmatched == ["cola/mcc"] and without == ["tydiqa/f1"]


def two_cells() -> list[dict]:
    records = []
    for cell, values in (("mean", [0.7, 0.5, 0.8]), ("mmr", [0.7, 0.75, 0.8])):
        for seed, value in enumerate(values):
            metrics = {"rte/accuracy": value, "rte/majority_accuracy": 0.527, "wall_s": 10.0 + seed}
            records.append(run_record(cell, {"variant": cell}, seed, metrics=metrics))
    return records


def test_the_study_aggregates_the_rate_per_cell_and_adds_the_metric_to_the_tables(tmp_path):
    results = aggregate(two_cells(), ["variant"], ["wall_s"], None, ["mean", "mmr"], ["rte/accuracy", "ner/f1"])
    assert results.metrics == ["wall_s", "rte/accuracy"] and results.failure == ["rte/accuracy"]
    assert results.failure_unmatched == ["ner/f1"]
    mean, mmr = (results.cell(name).failures["rte/accuracy"] for name in ("mean", "mmr"))
    assert (mean.failed, mean.scored, mean.failed_seeds, mmr.failed) == (1, 3, [1], 0)
    assert mean.baseline_mean == pytest.approx(0.527)
    stats = results.cell("mean").metrics["rte/accuracy"]
    assert (stats.min, stats.max) == (0.5, 0.8)
    saved = json.loads(json.dumps(results.to_json()))
    assert saved["cells"][0]["failures"]["rte/accuracy"]["failed_seeds"] == [1]
    rows = list(csv.DictReader(io.StringIO(results_csv(results))))
    by = {(r["cell"], r["metric"]): r for r in rows}
    assert by["mean", "rte/accuracy"]["at_or_below_majority"] == "1"
    assert by["mean", "rte/accuracy"]["scored_against_majority"] == "3"
    assert float(by["mmr", "rte/accuracy"]["majority_baseline"]) == pytest.approx(0.527)
    assert by["mean", "wall_s"]["at_or_below_majority"] == ""  # not a failure metric
    text = write_results(tmp_path, results)["md"].read_text()
    assert "## Stability over seeds: failed fine-tuning runs" in text
    assert "| mean | rte/accuracy | 0.6667 ± 0.1528 | 0.5–0.8 | 0.527 | 1/3 (33%) | 1 |" in text
    assert "| mmr | rte/accuracy | 0.75 ± 0.05 | 0.7–0.8 | 0.527 | 0/3 (0%) | – |" in text
    assert "No run has a metric matching: `ner/f1`." in text


def test_without_failure_metrics_nothing_changes_in_the_files():
    results = aggregate(two_cells(), ["variant"], ["*"], None, ["mean", "mmr"])
    assert results.failure == [] and all(c.failures == {} for c in results.cells)
    assert "majority" not in results_csv(results).splitlines()[0]


def test_a_metric_without_a_majority_baseline_is_named_in_study_md(tmp_path):
    records = [run_record("a", {"variant": "a"}, 0, metrics={"tydiqa/f1": 0.4})]
    results = aggregate(records, ["variant"], ["*"], None, ["a"], ["tydiqa/f1"])
    assert results.failure == [] and results.failure_without_baseline == ["tydiqa/f1"]
    text = write_results(tmp_path, results)["md"].read_text()
    assert (
        "No majority-class baseline (no class predicted for every example: regression, NER, QA) for: `tydiqa/f1`"
        in text
    )


@pytest.mark.parametrize(
    "failure, message",
    [
        (["wall_s"], "failure: 'wall_s' is not a task metric"),
        (["rte/majority_accuracy"], "names the majority-class baseline itself; name the model's metric (rte/accuracy)"),
        (["xnli/*/majority_*"], "names the majority-class baseline itself"),
        (["rte/accuracy", "rte/accuracy"], "a metric is listed twice"),
        ("rte/accuracy", "failure: Input should be a valid list"),
    ],
)
def test_bad_failure_entries_are_one_line_naming_the_problem(tmp_path, failure, message):
    path = write_study(tmp_path, failure=failure)
    with pytest.raises(ConfigError) as caught:
        plan(path)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_good_failure_list_is_kept(tmp_path):
    spec, _ = plan(write_study(tmp_path, failure=["glue_*/accuracy", "glue_cola/mcc"]))
    assert spec.failure == ["glue_*/accuracy", "glue_cola/mcc"]
