"""``run_study`` around its runs, without training: the runs are fake finished run folders (a marker and a
metrics.json), so the study has nothing to run and only claims, checks, recovers and reports."""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest
import yaml

from mtft.core.atomic import AtomicFolder, raise_if_disk_full
from mtft.core.errors import CheckpointError, ConfigError, DiskFullError
from mtft.core.runlock import run_lock
from mtft.study import runner
from mtft.study.jobs import RunJob
from mtft.study.runner import run_study
from mtft.study.spec import load_study
from mtft.study.state import open_study_dir, read_status, record_attempt, record_launch, status_path
from tests.helpers.launch import REPO

SOURCE = {"source": "aaaaaaaaaaaa", "commit": None}


def write_study(tmp_path: Path, **fields) -> Path:
    study = {
        "name": "s",
        "base": str(REPO / "configs" / "demo.yaml"),
        "grid": {"training.optimizer.lr": [0.001]},
        "seeds": [0, 1],
        "output_dir": str(tmp_path / "study"),
        **fields,
    }
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False), encoding="utf-8")
    return path


def study(path: Path, *overrides: str, report_only: bool = False) -> dict:
    spec, base = load_study(path, overrides)
    return run_study(spec, base, path, report_only=report_only)


def finish_runs(root: Path, *, name: str = "s", launched_at: float | None = None) -> None:
    """Study ``name``'s runs finished by hand: a complete run folder with metrics.json; with ``launched_at``, the
    status file holds only the launch note (the study was killed before it recorded the outcome)."""
    open_study_dir(root, name, f"name: {name}\n")
    for seed in (0, 1):
        run_dir = root / "runs" / "lr-0.001" / f"seed-{seed}"
        with AtomicFolder(run_dir).writing(kind="run") as partial:
            (partial / "metrics.json").write_text(json.dumps({"step": 6, "xnli/accuracy": 0.5 + seed / 10}))
        if launched_at is not None:
            record_launch(root / "status" / "lr-0.001" / f"seed-{seed}.json", SOURCE, launched_at)
            end = launched_at + 30.0 + seed  # metrics.json written 30 s (seed 1: 31 s) after the launch
            os.utime(run_dir / "metrics.json", (end, end))


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_refused_study_writes_nothing(tmp_path):
    """Issue 28, item 3: the changed study is refused, and study.yaml still describes the study its runs used."""
    path = write_study(tmp_path)
    finish_runs(tmp_path / "study")
    assert study(path)["complete"] == 2
    before = snapshot(tmp_path / "study")
    write_study(tmp_path, overrides={"training.max_steps": 5})  # the study file changed under its runs
    with pytest.raises(ConfigError, match=r"was run with a different config \(training.max_steps"):
        study(path)
    assert snapshot(tmp_path / "study") == before


def test_a_run_finished_but_never_recorded_gets_its_status_from_the_run(tmp_path):
    """Issue 28, item 4: the study died after the runs wrote metrics.json and before it recorded them."""
    path = write_study(tmp_path, metrics=["xnli/accuracy", "wall_s"])
    root = tmp_path / "study"
    launched = time.time() - 100.0
    finish_runs(root, launched_at=launched)
    assert study(path, report_only=True)["complete"] == 2  # what the report can know, before anything is written
    assert "status" not in read_status(root / "status" / "lr-0.001" / "seed-0.json")  # --report-only wrote none
    assert "Code: every run by mtft source aaaaaaaaaaaa." in (root / "study.md").read_text()
    study(path)
    for seed in (0, 1):
        status = read_status(root / "status" / "lr-0.001" / f"seed-{seed}.json")
        assert status["status"] == "finished" and status["code"] == [SOURCE] and "launched_at" not in status
        assert status["wall_s"] == pytest.approx(30.0 + seed) and status["recovered"]
    text = (root / "study.md").read_text()
    assert "Code: every run by mtft source aaaaaaaaaaaa." in text and "versions of the mtft source" not in text
    cells = json.loads((root / "results.json").read_text())["cells"]
    assert cells[0]["metrics"]["wall_s"]["mean"] == pytest.approx(30.5)


def test_a_recovered_run_without_a_launch_note_says_its_wall_time_is_unknown(tmp_path):
    path = write_study(tmp_path)
    root = tmp_path / "study"
    finish_runs(root)
    study(path)
    status = read_status(root / "status" / "lr-0.001" / "seed-0.json")
    assert status["status"] == "finished" and "wall_s" not in status and "wall time is unknown" in status["recovered"]
    assert "Code:" not in (root / "study.md").read_text()  # no source recorded: no claim about it


@pytest.mark.parametrize("what", ["a user's folder", "another study's folder"])
def test_report_only_on_a_folder_that_is_not_this_study_is_refused(tmp_path, what):
    path = write_study(tmp_path)
    root = tmp_path / "study"
    if what == "a user's folder":
        (root / "plots").mkdir(parents=True)
        for name in ("study.md", "results.csv", "plots/mine.png"):
            (root / name).write_text(f"the user's {name}")
        message = "is not a study directory"
    else:
        finish_runs(root, name="other")
        study(path, "name=other")
        message = "holds study 'other', not 's'"
    before = snapshot(root)
    with pytest.raises(ConfigError, match=message):
        study(path, report_only=True)
    assert snapshot(root) == before


def test_a_second_study_process_on_the_folder_is_refused(tmp_path):
    path = write_study(tmp_path)
    root = tmp_path / "study"
    finish_runs(root)
    study(path)
    before = snapshot(root)
    with run_lock(root):  # another study process holds the folder (flock: a second open file is refused)
        for report_only in (False, True):
            with pytest.raises(CheckpointError, match=f"{root} is in use by .*pid {os.getpid()}"):
                study(path, report_only=report_only)
    assert snapshot(root) == before


def test_output_dir_that_is_a_file_is_one_line(tmp_path):
    (tmp_path / "study").write_text("a file")
    with pytest.raises(ConfigError, match="is a file, not a study directory"):
        study(write_study(tmp_path))
    assert (tmp_path / "study").read_text() == "a file"


def test_slurm_that_is_not_there_is_said_before_anything_is_written(tmp_path, monkeypatch):
    """Without sbatch, submitit would run every job here (gpus_per_job: 0) or fail after the folder is written."""
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm-here"))
    path = write_study(tmp_path)
    root = tmp_path / "study"
    finish_runs(root)  # even with nothing to run: the command is refused, not half done
    before = snapshot(root)
    with pytest.raises(ConfigError, match="executor.name=slurm: Slurm is not available here"):
        study(path, "executor.name=slurm")
    with pytest.raises(ConfigError, match="executor.slurm.cluster=local runs on this machine"):
        study(path, "executor.name=slurm", "executor.slurm.cluster=local", "executor.slurm.gpus_per_job=1")
    assert snapshot(root) == before


def test_a_failed_leave_one_out_run_fails_the_study(tmp_path, monkeypatch):
    path = write_study(tmp_path, seeds=[0], leave_one_out={"count": 1})
    root = tmp_path / "study"
    open_study_dir(root, "s", "")
    with AtomicFolder(root / "runs" / "lr-0.001" / "seed-0").writing(kind="run") as partial:
        (partial / "metrics.json").write_text(json.dumps({"step": 6, "xnli/accuracy": 0.5}))

    def fail(spec, root, todo):  # the run on S^i fails (without training anything here)
        assert [run.key for run in todo] == ["lr-0.001/seed-0-loo-0"]
        record_attempt(status_path(root, todo[0]), "failed", 1, 1.0, "error: S^i went wrong")

    monkeypatch.setattr(runner, "execute", fail)
    assert study(path)["failed"] == 1
    # its error line is in study.md, as a failed run on S has its own
    assert "- lr-0.001/seed-0-loo-0: failed: error: S^i went wrong" in (root / "study.md").read_text()


# a finished run's metrics.json, damaged: what it holds, and the error its line names
DAMAGED = {
    "cut in half": (b'{"step": 6, "xnli/acc', "JSONDecodeError"),
    "empty": (b"", "JSONDecodeError"),
    "not an object": (b"[0.5, 0.6]", "holds a JSON list, not an object of metrics"),
    "a number": (b"0.5", "holds a JSON float"),
    "not UTF-8": (b'{"step": 6, "xnli/accuracy": 0.5, "n": "\xff"}', "UnicodeDecodeError"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGED))
def test_a_damaged_metrics_json_is_a_failed_run_named_in_the_report_and_on_stderr(tmp_path, capsys, damage):
    from argparse import Namespace

    from mtft.commands.study import main

    content, error = DAMAGED[damage]
    path = write_study(tmp_path)
    root = tmp_path / "study"
    finish_runs(root)
    (root / "runs" / "lr-0.001" / "seed-1" / "metrics.json").write_bytes(content)
    for report_only in (True, False):
        capsys.readouterr()
        assert study(path, report_only=report_only) == {"complete": 1, "failed": 1, "pending": 0, "damaged": 1}
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and "seed-1: damaged record: metrics.json cannot be read" in lines[0], lines
        assert error in lines[0]
        text = (root / "study.md").read_text()
        assert "seed-1`: damaged record: metrics.json cannot be read; delete the run's folder to run it again" in text
        assert "1 complete, 1 failed" in text
    args = Namespace(config=str(path), overrides=[], report_only=True)
    assert main(args) == 1  # --report-only says so by its exit status too
    (root / "runs" / "lr-0.001" / "seed-1" / "metrics.json").write_text(json.dumps({"step": 6, "xnli/accuracy": 1}))
    assert main(args) == 0


def test_a_resolved_config_that_is_not_utf8_is_one_line(tmp_path):
    path = write_study(tmp_path)
    root = tmp_path / "study"
    finish_runs(root)
    study(path)
    (root / "configs" / "lr-0.001" / "seed-0.yaml").write_bytes(b"run: {name: \xff\xfe}\n")
    with pytest.raises(ConfigError, match=r"seed-0.yaml is not the config the study wrote for lr-0.001/seed-0 \(Unic"):
        study(path)


@pytest.mark.parametrize("planted", ["logs/lr-0.001/seed-1.log", "runs/lr-0.001/seed-0/train.log"])
def test_a_symbolic_link_in_the_study_folder_is_refused_not_written_through(tmp_path, monkeypatch, planted):
    path = write_study(tmp_path)
    root = tmp_path / "study"
    finish_runs(root)
    shutil.rmtree(root / "runs" / "lr-0.001" / "seed-1")  # seed 1 is still to run: its job appends to its log
    outside = tmp_path / "outside.txt"
    outside.write_text("the user's file\n")
    (root / planted).parent.mkdir(parents=True, exist_ok=True)
    (root / planted).symlink_to(outside)
    monkeypatch.setattr(RunJob, "command", lambda self: [sys.executable, "-c", "print('trained')"])  # no training
    for report_only in (False, True):
        with pytest.raises(ConfigError, match=f"{root / planted} is a symbolic link \\(to {outside}\\)"):
            study(path, report_only=report_only)
    assert outside.read_text() == "the user's file\n"


@pytest.mark.parametrize("where", ["a library's write", "mtft's atomic write"])
def test_a_full_disk_is_one_line_whose_advice_the_study_accepts(tmp_path, monkeypatch, where):
    path = write_study(tmp_path)
    finish_runs(tmp_path / "study")
    full = tmp_path / "study" / "configs" / "x.yaml"

    def no_space(runs):
        error = OSError(errno.ENOSPC, "No space left on device", str(full))
        if where == "mtft's atomic write":
            raise_if_disk_full(error, full)
        raise error

    monkeypatch.setattr(runner, "write_run_configs", no_space)
    with pytest.raises(DiskFullError) as caught:
        study(path)
    message = str(caught.value)
    assert message.startswith(f"no space left on {full}; free some space, then run the same study command again")
    assert "--resume" not in message and "\n" not in message
