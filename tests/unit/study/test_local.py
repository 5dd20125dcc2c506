"""The local executor's clean stop, and the command it tells the user to continue with."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys

import pytest

from mtft.cli import _resume_command
from mtft.core.errors import Interrupted
from mtft.study.local import run_local


def test_a_stopped_study_says_how_to_continue_from_any_folder(tmp_path, monkeypatch):
    """The study's relative paths resolve against the folder it was started in: the printed command goes there."""
    monkeypatch.chdir(tmp_path)

    def stopped_by_ctrl_c() -> dict:
        os.kill(os.getpid(), signal.SIGINT)  # caught by run_local's handler: a clean stop
        return {"key": "c/seed-0", "status": "interrupted", "returncode": 130, "error": None}

    with pytest.raises(Interrupted) as caught:
        run_local([stopped_by_ctrl_c, stopped_by_ctrl_c], 1, lambda result: None)  # type: ignore[list-item]
    assert caught.value.continue_in == str(tmp_path) and not caught.value.resume_flag
    monkeypatch.setattr(sys, "argv", ["run.py", "study"])
    argv = ["study", "--config", "studies/my study.yaml"]
    command = _resume_command("python run.py", argv, False, caught.value.continue_in)
    assert command == f"cd {shlex.quote(str(tmp_path))} && python run.py study --config 'studies/my study.yaml'"
    monkeypatch.setattr(sys, "argv", ["/opt/mtft/run.py", "study"])  # launched by its path from elsewhere
    assert "&& python /opt/mtft/run.py study" in _resume_command("python run.py", argv, False, str(tmp_path))


def test_the_printed_command_runs_from_another_folder(tmp_path):
    """The cd part is a shell command that works wherever the user is (here: a folder with a space)."""
    where = tmp_path / "the study's folder"
    where.mkdir()
    command = _resume_command("python -c 'import os; print(os.getcwd())'", [], False, str(where))
    out = subprocess.run(command, shell=True, cwd="/", capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(where)
