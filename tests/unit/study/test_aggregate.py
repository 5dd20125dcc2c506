"""A study's numbers: per-cell statistics, paired differences against the baseline, failed/pending/NaN runs."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from mtft.study.aggregate import aggregate, expand_metrics, family, is_per_objective, objective, run_record
from tests.helpers.study import AXES, CELLS, grid_records


def test_per_cell_statistics_equal_numpy_over_the_seeds():
    records = grid_records()
    results = aggregate(records, AXES, ["*"], None, CELLS)
    assert [c.name for c in results.cells] == CELLS
    assert results.metrics == sorted(records[0]["metrics"])
    for cell in results.cells:
        assert cell.complete == 4 and cell.failed == [] and cell.pending == []
        for metric in results.metrics:
            values = np.array([r["metrics"][metric] for r in records if r["cell"] == cell.name])
            got = cell.metrics[metric]
            assert (got.n, got.nan, got.missing) == (4, 0, 0)
            assert got.mean == pytest.approx(values.mean(), rel=1e-12)
            assert got.std == pytest.approx(values.std(ddof=1), rel=1e-12)
            assert (got.min, got.max) == (values.min(), values.max())
    assert results.differences == [] and results.test == "paired t-test"


def test_metric_patterns_keep_their_order_sorted_within_and_report_what_matched_nothing():
    available = {"xnli/accuracy", "xnli/en/accuracy", "xnli/ar/accuracy", "wall_s", "F_p_final"}
    names, unmatched = expand_metrics(["wall_s", "xnli/*/accuracy", "tydiqa/*", "xnli/*"], available)
    assert names == ["wall_s", "xnli/ar/accuracy", "xnli/en/accuracy", "xnli/accuracy"]
    assert unmatched == ["tydiqa/*"]
    assert is_per_objective("xnli/en/accuracy") and not is_per_objective("xnli/accuracy")
    assert family("xnli/en/accuracy") == "xnli/*/accuracy" and objective("xnli/en/accuracy") == "en"
    assert family("F_p_final/xnli/en") == "F_p_final/*" and objective("F_p_final/xnli/en") == "xnli/en"


def test_paired_difference_matches_a_hand_computation_and_scipy():
    """Cell values 0.80, 0.83, 0.79 against 0.78, 0.80, 0.78: differences 0.02, 0.03, 0.01, mean 0.02, sample std
    0.01; t_{0.975, 2 dof} = 4.302653, so the 95% interval is 0.02 ± 4.302653 · 0.01 / √3 = 0.02 ± 0.0248414."""
    axes = {"variant": "mean"}, {"variant": "mgda"}
    records = [run_record("mean", axes[0], s, metrics={"acc": v}) for s, v in zip((1, 2, 3), (0.78, 0.80, 0.78))]
    records += [run_record("mgda", axes[1], s, metrics={"acc": v}) for s, v in zip((1, 2, 3), (0.80, 0.83, 0.79))]
    results = aggregate(records, ["variant"], ["acc"], {"variant": "mean"}, ["mean", "mgda"])
    [d] = results.differences
    assert (d.cell, d.baseline_cell, d.metric, d.n_pairs, d.seeds) == ("mgda", "mean", "acc", 3, [1, 2, 3])
    assert d.mean == pytest.approx(0.02) and d.std == pytest.approx(0.01)
    assert d.ci_low == pytest.approx(0.02 - 0.0248414, abs=1e-6)
    assert d.ci_high == pytest.approx(0.02 + 0.0248414, abs=1e-6)
    reference = stats.ttest_rel([0.80, 0.83, 0.79], [0.78, 0.80, 0.78])
    assert d.p_value == pytest.approx(reference.pvalue, rel=1e-12)
    interval = reference.confidence_interval(0.95)
    assert (d.ci_low, d.ci_high) == pytest.approx((interval.low, interval.high), rel=1e-9)


def test_partner_cell_keeps_the_other_axes_and_pairs_only_seeds_complete_in_both():
    records = grid_records()
    for r in records:  # the baseline at lr=0.01 lost seed 0; the mgda cell at lr=0.01 lost seed 3
        if (r["cell"], r["seed"]) == ("mean_lr-0.01", 0):
            r.update(status="failed", error="CUDA out of memory", metrics={})
        if (r["cell"], r["seed"]) == ("mgda_lr-0.01", 3):
            r.update(status="pending", metrics={})
    results = aggregate(records, AXES, ["xnli/accuracy"], {"variant": "mean"}, CELLS)
    assert [(d.cell, d.baseline_cell) for d in results.differences] == [
        ("mgda_lr-0.001", "mean_lr-0.001"),
        ("mgda_lr-0.01", "mean_lr-0.01"),
    ]
    d = results.difference("mgda_lr-0.01", "xnli/accuracy")
    assert d.seeds == [1, 2] and d.n_pairs == 2
    value = {(r["cell"], r["seed"]): r["metrics"].get("xnli/accuracy") for r in records}
    diffs = np.array([value["mgda_lr-0.01", s] - value["mean_lr-0.01", s] for s in (1, 2)])
    assert d.mean == pytest.approx(diffs.mean()) and d.std == pytest.approx(diffs.std(ddof=1))
    half = stats.t.ppf(0.975, 1) * diffs.std(ddof=1) / math.sqrt(2)
    assert (d.ci_low, d.ci_high) == pytest.approx((diffs.mean() - half, diffs.mean() + half))
    assert results.difference("mgda_lr-0.001", "xnli/accuracy").n_pairs == 4


def test_failed_and_pending_runs_are_counted_and_listed():
    records = grid_records(seeds=(0, 1, 2))
    records[0].update(status="failed", error="loss is NaN at step 12", metrics={})
    records[1].update(status="failed", error=None, metrics={})
    records[2].update(status="pending", metrics={})
    results = aggregate(records, AXES, ["xnli/accuracy"], None, CELLS)
    cell = results.cell("mean_lr-0.001")
    assert cell.complete == 0 and cell.pending == ["runs/mean_lr-0.001/seed-2"]
    assert [(f.run_dir, f.seed, f.error) for f in cell.failed] == [
        ("runs/mean_lr-0.001/seed-0", 0, "loss is NaN at step 12"),
        ("runs/mean_lr-0.001/seed-1", 1, "failed without an error line"),
    ]
    stats_ = cell.metrics["xnli/accuracy"]
    assert (stats_.n, stats_.mean, stats_.std, stats_.min, stats_.max) == (0, None, None, None, None)
    assert results.cell("mgda_lr-0.01").complete == 3


def test_missing_keys_one_run_and_no_run():
    records = [
        run_record("a", {"variant": "a"}, 0, metrics={"acc": 0.5, "f1": 0.4}),
        run_record("a", {"variant": "a"}, 1, metrics={"acc": 0.7}),  # no f1
        run_record("b", {"variant": "b"}, 0, status="pending"),
    ]
    results = aggregate(records, ["variant"], ["acc", "f1"], {"variant": "a"}, ["a", "b"])
    f1 = results.cell("a").metrics["f1"]
    assert (f1.n, f1.missing, f1.mean, f1.std, f1.min, f1.max) == (1, 1, 0.4, None, 0.4, 0.4)
    assert results.cell("a").metrics["acc"].std == pytest.approx(np.std([0.5, 0.7], ddof=1))
    none = results.cell("b").metrics["acc"]
    assert (none.n, none.missing, none.mean, none.std) == (0, 0, None, None)
    d = results.difference("b", "acc")
    assert (d.n_pairs, d.mean, d.std, d.ci_low, d.p_value) == (0, None, None, None, None)


def test_one_pair_gives_a_difference_without_an_interval():
    records = [run_record(c, {"variant": c}, 0, metrics={"acc": v}) for c, v in (("a", 0.5), ("b", 0.75))]
    [d] = aggregate(records, ["variant"], ["acc"], {"variant": "a"}, ["a", "b"]).differences
    assert (d.n_pairs, d.mean, d.std, d.ci_low, d.ci_high, d.p_value) == (1, 0.25, None, None, None, None)


def test_nan_values_are_counted_not_averaged_and_leave_the_pairs():
    records = [run_record("a", {"variant": "a"}, s, metrics={"loss": v}) for s, v in enumerate((1.0, 2.0, 3.0))]
    records += [
        run_record("b", {"variant": "b"}, s, metrics={"loss": v}) for s, v in enumerate((math.nan, 2.5, math.inf))
    ]
    results = aggregate(records, ["variant"], ["loss"], {"variant": "a"}, ["a", "b"])
    b = results.cell("b").metrics["loss"]
    assert (b.n, b.nan, b.mean, b.std) == (1, 2, 2.5, None)
    d = results.difference("b", "loss")
    assert (d.seeds, d.mean) == ([1], 0.5)
    json.dumps(results.to_json(), allow_nan=False)  # strict JSON: no NaN written anywhere


def test_identical_differences_have_a_zero_width_interval():
    records = [run_record("a", {"variant": "a"}, s, metrics={"acc": 0.5 + s}) for s in range(3)]
    records += [run_record("b", {"variant": "b"}, s, metrics={"acc": 0.5 + s}) for s in range(3)]
    d = aggregate(records, ["variant"], ["acc"], {"variant": "a"}, ["a", "b"]).difference("b", "acc")
    assert (d.mean, d.std, d.ci_low, d.ci_high, d.p_value) == (0.0, 0.0, 0.0, 0.0, None)


def test_a_cell_without_its_baseline_partner_is_named():
    records = [
        run_record("mean_lr-1", {"variant": "mean", "lr": 1}, 0, metrics={"acc": 0.5}),
        run_record("mgda_lr-2", {"variant": "mgda", "lr": 2}, 0, metrics={"acc": 0.6}),
    ]
    results = aggregate(records, ["variant", "lr"], ["acc"], {"variant": "mean"}, ["mean_lr-1", "mgda_lr-2"])
    assert results.differences == [] and results.no_partner == ["mgda_lr-2"]


def test_records_that_do_not_fit_the_study_are_refused():
    good = run_record("a", {"variant": "a"}, 0, metrics={"acc": 0.5})
    with pytest.raises(ValueError, match="not one of the study's cells"):
        aggregate([good, run_record("zz", {"variant": "zz"}, 0)], ["variant"], ["acc"], None, ["a"])
    with pytest.raises(ValueError, match="two run records of one seed"):
        aggregate([good, dict(good)], ["variant"], ["acc"], None, ["a"])
    with pytest.raises(ValueError, match="status 'running'"):
        aggregate([run_record("a", {"variant": "a"}, 0, status="running")], ["variant"], ["acc"], None, ["a"])
