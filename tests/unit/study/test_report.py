"""A study's files: results.json, results.csv, study.md and the plots, written from constructed run records."""

from __future__ import annotations

import csv
import json
import math
import re

import pytest

from mtft.study import plots
from mtft.study.aggregate import aggregate, run_record
from mtft.study.plots import axis_scale
from mtft.study.report import write_results
from tests.helpers.study import AXES, CELLS, grid_records

SAFE = re.compile(r"[A-Za-z0-9_.-]+\.png")


def grid_results(baseline="variant=mean", metrics=("*",)):
    records = grid_records(seeds=(0, 1, 2))
    records[0].update(status="failed", error="loss is NaN at step 12 | diverged", metrics={})
    records[1].update(status="pending", metrics={})
    records[-1]["metrics"]["xnli/accuracy"] = math.nan
    baseline = dict([baseline.split("=")]) if baseline else None
    return aggregate(records, AXES, list(metrics), baseline, CELLS)


def number(text: str):
    return None if text == "" else float(text)


def test_csv_and_json_hold_the_aggregated_numbers(tmp_path):
    results = grid_results()
    paths = write_results(tmp_path, results, command="python run.py study --config s.yaml")
    assert json.loads(paths["json"].read_text()) == results.to_json()
    rows = list(csv.DictReader(paths["csv"].open()))
    assert len(rows) == len(CELLS) * len(results.metrics)
    for row in rows:
        cell = results.cell(row["cell"])
        assert row["variant"] == cell.axes["variant"]
        assert float(row["training.optimizer.lr"]) == cell.axes["training.optimizer.lr"]
        stats = cell.metrics[row["metric"]]
        for key in ("mean", "std", "min", "max"):
            assert number(row[key]) == getattr(stats, key)
        assert (int(row["n"]), int(row["nan"]), int(row["failed"]), int(row["pending"])) == (
            stats.n,
            stats.nan,
            len(cell.failed),
            len(cell.pending),
        )
        d = results.difference(row["cell"], row["metric"])
        if cell.axes["variant"] == "mean":
            assert d is None and row["diff_mean"] == row["baseline_cell"] == ""
        else:
            assert row["baseline_cell"] == d.baseline_cell and int(row["n_pairs"]) == d.n_pairs
            columns = ("diff_mean", "diff_std", "ci_low", "ci_high", "p_value")
            assert [number(row[c]) for c in columns] == [d.mean, d.std, d.ci_low, d.ci_high, d.p_value]
    with_interval = results.difference("mgda_lr-0.01", "wall_s")
    assert with_interval.n_pairs == 3 and with_interval.ci_low < with_interval.mean < with_interval.ci_high
    first = next(r for r in rows if (r["cell"], r["metric"]) == ("mean_lr-0.001", "xnli/accuracy"))
    assert (first["n"], first["failed"], first["pending"]) == ("1", "1", "1")
    nan_row = next(r for r in rows if (r["cell"], r["metric"]) == ("mgda_lr-0.01", "xnli/accuracy"))
    assert (nan_row["n"], nan_row["nan"]) == ("2", "1")


def test_study_md_shows_tables_failures_pending_differences_and_plots(tmp_path):
    results = grid_results()
    text = write_results(tmp_path, results, name="lr-sweep", command="python run.py study --config s.yaml")["md"]
    text = text.read_text()
    assert text.startswith("# Study: lr-sweep\n") and "Command: `python run.py study --config s.yaml`" in text
    assert "12 runs: 10 complete, 1 failed, 1 pending" in text
    assert "- `runs/mean_lr-0.001/seed-0`: loss is NaN at step 12 | diverged" in text
    stats = results.cell("mgda_lr-0.001").metrics["wall_s"]
    assert f"| {stats.mean:.4g} ± {stats.std:.4g} (3) |" in text
    nan = results.cell("mgda_lr-0.01").metrics["xnli/accuracy"]
    assert f"{nan.mean:.4g} ± {nan.std:.4g} (2, 1 nan)" in text
    one = results.cell("mean_lr-0.001").metrics["wall_s"]
    assert f"| {one.mean:.4g} (1) |" in text  # one run: no std
    assert "### xnli/*/accuracy (per objective)" in text and "| cell | ar | en |" in text
    assert "## Paired differences against the baseline (variant=mean)" in text and "paired t-test" in text
    d = results.difference("mgda_lr-0.01", "wall_s")
    assert f"| mgda_lr-0.01 | mean_lr-0.01 | wall_s | 3 | {d.mean:.4g} | {d.std:.4g} |" in text
    links = re.findall(r"!\[[^\]]*\]\((plots/[^)]+)\)", text)
    assert links and all((tmp_path / link).is_file() for link in links)


def test_plots_of_a_2x2_grid_exist_with_safe_names(tmp_path):
    results = grid_results()
    write_results(tmp_path, results)
    files = sorted(p.name for p in (tmp_path / "plots").glob("*.png"))
    scalar = ["F_p_final", "wall_s", "xnli_accuracy"]
    expected = [f"{m}__vs__{a}.png" for m in scalar for a in ("training.optimizer.lr", "variant")]
    assert files == sorted(expected + ["objectives__xnli_accuracy.png"])
    assert all(SAFE.fullmatch(f) and (tmp_path / "plots" / f).stat().st_size > 1000 for f in files)


def test_the_figure_cap_is_said_in_study_md_and_a_rewrite_leaves_no_stale_plot(tmp_path, monkeypatch):
    write_results(tmp_path, grid_results())
    monkeypatch.setattr(plots, "MAX_FIGURES", 2)
    text = write_results(tmp_path, grid_results())["md"].read_text()
    assert len(list((tmp_path / "plots").glob("*.png"))) == 2
    assert "5 more figure(s) not drawn (at most 2); every number is in results.csv." in text


def test_without_baseline_there_are_no_difference_columns_and_no_difference_section(tmp_path):
    paths = write_results(tmp_path, grid_results(baseline=None, metrics=("wall_s", "nothing/*")))
    header = paths["csv"].read_text().splitlines()[0]
    assert header == "cell,variant,training.optimizer.lr,metric,n,nan,missing,mean,std,min,max,complete,failed,pending"
    text = paths["md"].read_text()
    assert "Paired differences" not in text and "No run has a metric matching: `nothing/*`." in text
    assert "Command: `(not recorded)`" in text and text.startswith(f"# Study: {tmp_path.name}\n")


def test_a_study_with_no_finished_run_writes_empty_tables_and_no_plot(tmp_path):
    records = [run_record(c, {"variant": c}, 0, status="pending") for c in ("a", "b")]
    results = aggregate(records, ["variant"], ["*"], {"variant": "a"}, ["a", "b"])
    paths = write_results(tmp_path, results)
    assert list((tmp_path / "plots").glob("*.png")) == []
    assert "2 runs: 0 complete, 0 failed, 2 pending" in paths["md"].read_text()
    assert "No run has a metric matching: `*`." in paths["md"].read_text()


@pytest.mark.parametrize(
    "values, scale",
    [
        ([1e-4, 1e-3], "log"),
        ([0.1, 0.5], "linear"),
        ([-1, 10], "linear"),
        (["mean", "mgda"], "category"),
        ([1, "a"], "category"),
    ],
)
def test_axis_scale(values, scale):
    assert axis_scale(values) == scale


def test_runs_from_several_versions_of_the_source_are_flagged(tmp_path):
    records = grid_records(seeds=(0, 1))
    unrecorded = aggregate(records, AXES, ["*"], None, CELLS)
    assert "Code:" not in write_results(tmp_path / "none", unrecorded)["md"].read_text()
    for record in records:
        record["code"] = ["aaaaaaaaaaaa"]
    one = aggregate(records, AXES, ["*"], None, CELLS)
    text = write_results(tmp_path / "one", one)["md"].read_text()
    assert one.code_versions == {"aaaaaaaaaaaa": len(records)}
    assert "Code: every run by mtft source aaaaaaaaaaaa." in text and "versions of the mtft source" not in text
    records[1]["code"] = []  # finished before versions were recorded: not a version of its own
    partly = write_results(tmp_path / "partly", aggregate(records, AXES, ["*"], None, CELLS))["md"].read_text()
    assert "Code: every run that recorded one by mtft source aaaaaaaaaaaa (1 run(s) recorded no source)." in partly
    assert "versions of the mtft source" not in partly
    records[0]["code"] = ["aaaaaaaaaaaa", "bbbbbbbbbbbb"]  # resumed under an edited source
    mixed = aggregate(records, AXES, ["*"], None, CELLS)
    assert mixed.code_versions == {"aaaaaaaaaaaa": len(records) - 1, "bbbbbbbbbbbb": 1, "unrecorded": 1}
    text = write_results(tmp_path / "mixed", mixed)["md"].read_text()
    assert "**Code: the complete runs come from 2 versions of the mtft source**" in text
    assert "(1 run(s) recorded no source)" in text
