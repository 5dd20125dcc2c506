"""A leave_one_out study end to end: full fine-tuning and head tuning, 1 seed, 1 draw removing one example; the
LOO distances are finite, positive and equal to the distance of the two runs' trained parameters as load_run
restores them."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from mtft.training.restore import load_run
from tests.helpers.launch import REPO, launch_cli
from tests.helpers.plugin_kind import write_kind_task
from tests.helpers.study import study_failure

pytestmark = pytest.mark.timeout(600)
CELLS = {"full": "encoder weights + task heads", "head": "task heads"}


def trained_vector(run_dir: Path) -> torch.Tensor:
    model = load_run(run_dir).model
    return torch.cat([p.detach().double().flatten() for p in model.parameters() if p.requires_grad])


def run_loo_study(tmp_path: Path, steps: int, overrides: dict, **study: object):
    """A leave_one_out study (1 draw removing one example) on tests/e2e/base.yaml with ``overrides`` for ``steps``
    steps, run through the CLI: (its output folder, the finished process)."""
    out = tmp_path / "study"
    every = {f"{key}.every_steps": steps for key in ("evaluation", "checkpointing", "logging")}
    spec = {
        "name": "loo",
        "base": str(REPO / "tests/e2e/base.yaml"),
        "overrides": {
            "weighting.method": "mean",
            "weighting.options": {},
            "training.max_steps": steps,
            "training.micro_batch_size": 16,
            "corpus.languages": ["en"],
            **every,
            **overrides,
        },
        "leave_one_out": {"count": 1, "draws": 1, "seed": 11},
        "output_dir": str(out),
        "executor": {"name": "local", "workers": 2},
        **study,
    }
    path = tmp_path / "loo.yaml"
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    # the study and its runs forked from the warm Python (a study launched cold starts its runs cold too); its 2
    # workers wait for the other multi-process launches
    done = launch_cli("study", "--config", str(path), processes=2, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    assert done.returncode == 0, study_failure(done, out)
    return out, done


def test_leave_one_out_study_reports_the_distance_of_each_pair(tmp_path):
    data = {
        "data.tasks.0.languages": ["en"],
        "data.tasks.0.max_train_examples": 48,
        "data.tasks.0.max_eval_examples": 32,
    }
    out, done = run_loo_study(
        tmp_path,
        6,
        data,
        variants=[{"name": m, "overrides": {"model.adapter.method": m}} for m in CELLS],
        seeds=[3],
        metrics=["xnli/accuracy"],
    )
    assert "leave-one-out stability of 2 pair(s)" in done.stdout

    results = json.loads((out / "results.json").read_text())
    assert [c["complete"] for c in results["cells"]] == [1, 1]  # the runs on S^i are not seeds of the cell
    cells = {c["name"]: c for c in json.loads((out / "loo.json").read_text())}
    assert list(cells) == list(CELLS)
    for name, part in CELLS.items():
        cell = cells[name]
        assert cell["trained_part"].startswith(part + " (") and not cell["missing"]
        (pair,) = cell["pairs"]
        assert (pair["seed"], pair["draw"]) == (3, 0)
        s, s_i = out / "runs" / name / "seed-3", out / "runs" / name / "seed-3-loo-0"
        assert yaml.safe_load((s_i / "config.yaml").read_text())["data"]["leave_out"]["count"] == 1
        a, b = trained_vector(s), trained_vector(s_i)
        assert 0 < pair["distance"] and math.isfinite(pair["distance"])
        assert pair["distance"] == pytest.approx(float((a - b).norm()), rel=1e-9)
        assert pair["normalized"] == pytest.approx(float((a / a.norm() - b / b.norm()).norm()), rel=1e-9)
        assert 0 < pair["normalized"] <= 2
        assert cell["distance"]["mean"] == pair["distance"] and cell["distance"]["n"] == 1
    assert "## Leave-one-out stability" in (out / "study.md").read_text()


def test_leave_one_out_study_over_a_plug_in_head_kind(tmp_path):
    """The study rebuilds each run's model as the run loader does, head kinds of task plug-ins included."""
    tasks = write_kind_task(tmp_path / "tasks")
    plug_in = {
        "data.task_dirs": [str(tasks)],
        "data.tasks": [{"name": "nli_tempered", "languages": ["en"], "max_train_examples": 32}],
        "evaluation.metric_for_best": "nli_tempered/accuracy",
        "model.adapter.method": "head",
    }
    out, _ = run_loo_study(tmp_path, 2, plug_in, seeds=[5], metrics=["nli_tempered/accuracy"])
    (cell,) = json.loads((out / "loo.json").read_text())
    assert cell["trained_part"].startswith("task heads (") and not cell["missing"]
    (pair,) = cell["pairs"]
    assert 0 < pair["distance"] and math.isfinite(pair["distance"])
    # the study's planning imported the plug-in, enrolling its kind in that process; a fresh process reading
    # the run's trained part learns the kind from the run's own task copies
    run = out / "runs" / "base" / "seed-5"
    read = "from mtft.study.loo import final_checkpoint, trained_part; import sys; r = sys.argv[1]; "
    read += "print(trained_part(r, final_checkpoint(r)).size)"
    fresh = subprocess.run([sys.executable, "-c", read, str(run)], capture_output=True, text=True, cwd=tmp_path)
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    assert f"({int(fresh.stdout):,} weights)" in cell["trained_part"]
