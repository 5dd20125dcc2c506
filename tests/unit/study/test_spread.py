"""The spread analysis: each cell's std over seeds against its baseline partner's, by hand, with the Brown–Forsythe
p-value scipy gives, the undefined cases left empty, and the study.md section and spread.json written from a study's
records."""

from __future__ import annotations

import json

import pytest
from scipy import stats

from mtft.study.aggregate import aggregate, run_record
from mtft.study.analyses import build_analyses, write_analyses
from mtft.study.spread import spread_comparison


def test_the_ratio_of_sample_stds_and_the_brown_forsythe_p_value():
    cell, base = [0.5, 0.7, 0.9], [0.6, 0.7, 0.8]  # stds 0.2 and 0.1
    got = spread_comparison(cell, base)
    assert got["std"] == pytest.approx(0.2) and got["std_baseline"] == pytest.approx(0.1)
    assert got["ratio"] == pytest.approx(2.0)
    # |x - median|: [0.2, 0, 0.2] vs [0.1, 0, 0.1] -> a one-way ANOVA of those deviations
    assert got["p_value"] == pytest.approx(stats.f_oneway([0.2, 0.0, 0.2], [0.1, 0.0, 0.1]).pvalue)
    assert (got["n"], got["n_baseline"]) == (3, 3)


@pytest.mark.parametrize(
    "cell, base, empty",
    [
        ([0.5], [0.6, 0.7], {"std", "std_baseline", "ratio", "p_value"}),  # one seed: no std
        ([0.5, 0.7], [0.6, 0.6], {"ratio", "p_value"}),  # a baseline without spread: no ratio; deviations constant
        ([0.5, 0.7, 0.8], [0.6, 0.6, 0.6], {"ratio"}),  # ... p defined once the deviations vary
        ([0.5, 0.7, 0.8], [49 / 60] * 3, {"ratio"}),  # equal values whose float std is 1e-16, not a spread
        ([0.6, 0.6], [0.6, 0.6], {"ratio", "p_value"}),  # no spread anywhere: nothing to test
    ],
)
def test_undefined_comparisons_are_left_empty(cell, base, empty):
    got = spread_comparison(cell, base)
    assert {k for k, v in got.items() if v is None} == empty


def test_the_section_and_the_file_pair_each_cell_with_the_baseline_partner(tmp_path):
    values = {"mean": [0.6, 0.7, 0.8], "lfmlf": [0.5, 0.7, 0.9, 0.8]}
    records = [
        run_record(cell, {"weighting.method": cell}, seed, metrics={"xnli/accuracy": v, "wall_s": 1.0})
        for cell, vs in values.items()
        for seed, v in enumerate(vs)
    ] + [run_record("lfmlf", {"weighting.method": "lfmlf"}, 9, status="failed", error="boom")]
    axes, baseline = ["weighting.method"], {"weighting.method": "mean"}
    results = aggregate(records, axes, ["xnli/accuracy", "wall_s"], baseline, ["mean", "lfmlf"])
    analyses = build_analyses({"spread": {}}, axes)
    lines = write_analyses(tmp_path, analyses, records, results)
    (row,) = json.loads((tmp_path / "analyses" / "spread" / "spread.json").read_text())["rows"]
    want = spread_comparison(values["lfmlf"], values["mean"])  # the failed run takes no part
    assert row == {"cell": "lfmlf", "baseline_cell": "mean", "metric": "xnli/accuracy", **want}
    assert want["n"] == 4 and want["ratio"] > 1
    table = [line for line in lines if line.startswith("| lfmlf")]
    assert table == [f"| lfmlf | mean | {want['ratio']:.2f} (p {want['p_value']:.2f}) | 0/1 |"]
