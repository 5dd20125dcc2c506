"""One process at a time in a run directory (mtft.core.runlock)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mtft.core.errors import CheckpointError
from mtft.core.runlock import lock_path, run_lock

HOLD = """
import sys, time
from mtft.core.runlock import run_lock
with run_lock(sys.argv[1]):
    print("locked", flush=True)
    sys.stdin.readline()
"""


def test_a_second_holder_is_refused_with_the_first_named(tmp_path):
    run_dir = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.getcwd(),
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(CheckpointError, match=f"in use by another run \\(pid {holder.pid} on "):
            with run_lock(run_dir):
                pass
    finally:
        holder.communicate("\n", timeout=60)
    with run_lock(run_dir) as path:  # released when its holder ended
        assert json.loads(path.read_text())["pid"] == os.getpid() and path == lock_path(run_dir)
    assert not run_dir.exists()  # the lock lives beside the run directory, which it does not create


def test_released_on_an_error(tmp_path):
    with pytest.raises(RuntimeError):
        with run_lock(tmp_path / "run"):
            raise RuntimeError("boom")
    with run_lock(tmp_path / "run"):
        pass


def test_a_refused_run_of_a_finished_run_directory_adds_no_lock_file(tmp_path):
    from mtft.core.atomic import AtomicFolder

    run_dir = tmp_path / "run"
    with AtomicFolder(run_dir).writing(kind="run"):
        pass
    with pytest.raises(CheckpointError):
        with run_lock(run_dir):
            raise CheckpointError("cannot resume: no intact checkpoint")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    with run_lock(run_dir) as path:  # a run that ends well leaves its lock file, as before
        pass
    assert path.is_file()
    with pytest.raises(CheckpointError):
        with run_lock(run_dir):  # the file was there before: it stays
            raise CheckpointError("refused")
    assert path.is_file()


@pytest.mark.parametrize("stage", ["pretrain", "finetune"])
def test_every_stage_of_run_py_takes_the_run_lock_before_it_starts(tmp_path, monkeypatch, stage):
    """A pre-training run (``run.stage: pretrain``) is refused in a run directory in use, as a fine-tuning run is,
    before it loads anything (a pre-training run used to take no lock)."""
    import mtft.training.preflight
    from mtft.cli import main
    from tests.helpers.launch import REPO

    def started(*args):
        raise AssertionError("the run started without the run directory's lock")

    monkeypatch.setattr(mtft.training.preflight, "preflight_pretrain", started)
    monkeypatch.chdir(REPO)
    run_dir = tmp_path / "run"
    with run_lock(run_dir):  # another run holds it (flock: another open file conflicts, in this process too)
        with pytest.raises(CheckpointError, match="is in use by another run"):
            main(["--config", "tests/e2e/base.yaml", f"run.output_dir={run_dir}", f"run.stage={stage}"])
    assert not run_dir.exists()
