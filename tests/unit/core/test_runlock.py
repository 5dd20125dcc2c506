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
