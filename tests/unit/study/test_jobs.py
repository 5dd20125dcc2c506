"""The job object both executors run: its command, environment and outcome, without training anything."""

from __future__ import annotations

import sys

from mtft.core.atomic import AtomicFolder
from mtft.core.version import code_version
from mtft.study.jobs import RunJob, error_line
from mtft.study.state import read_status, record_attempt


def job(tmp_path, **extra) -> RunJob:
    return RunJob(
        key="c/seed-0",
        config_path=str(tmp_path / "c.yaml"),
        run_dir=str(tmp_path / "run"),
        log_path=str(tmp_path / "logs" / "c.log"),
        status_path=str(tmp_path / "status" / "c.json"),
        **{"cwd": str(tmp_path), **extra},
    )


def test_a_started_run_is_resumed_and_a_new_one_is_not(tmp_path):
    assert job(tmp_path).command() == [*job(tmp_path).interpreter(), "--config", str(tmp_path / "c.yaml")]
    assert job(tmp_path).interpreter()[0] == sys.executable
    with AtomicFolder(tmp_path / "run").writing(kind="run"):
        pass
    assert job(tmp_path).command()[-1] == "--resume"


def test_threads_and_no_leaked_launch_variables(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("MASTER_PORT", "1234")
    env = job(tmp_path, threads=2).environment()
    assert env["OMP_NUM_THREADS"] == "2" and "RANK" not in env and "MASTER_PORT" not in env


def test_error_line_is_the_runs_own_error_else_its_last_line(tmp_path):
    log = tmp_path / "log"
    log.write_text("[mtft] step 1\nerror: data file x.jsonl is not UTF-8\n\n")
    assert error_line(log) == "error: data file x.jsonl is not UTF-8"
    log.write_text("Traceback (most recent call last):\n  ...\nRuntimeError: boom\n")
    assert error_line(log) == "RuntimeError: boom"


def test_a_failing_run_is_recorded_with_its_error_line(tmp_path):
    (tmp_path / "c.yaml").write_text("run: {name: x\n")  # broken YAML: the child exits 2 with one error line
    outcome = job(tmp_path)()
    assert outcome["status"] == "failed" and outcome["returncode"] == 2
    status = read_status(tmp_path / "status" / "c.json")
    assert status["status"] == "failed" and status["error"].startswith("error: ") and status["attempts"] == 1
    assert status["code"] == [code_version()]  # the source the run was launched with
    job(tmp_path)()
    again = read_status(tmp_path / "status" / "c.json")
    assert again["attempts"] == 2 and again["code"] == [code_version()]  # one version, listed once


def test_a_run_resumed_under_other_code_keeps_both_versions(tmp_path):
    path = tmp_path / "status.json"
    old, new = {"source": "aaaaaaaaaaaa", "commit": None}, {"source": "bbbbbbbbbbbb", "commit": "0123456789ab"}
    record_attempt(path, "interrupted", 143, 5.0, "stopped", old)
    record_attempt(path, "finished", 0, 7.0, None, new)
    status = read_status(path)
    assert status["code"] == [old, new] and status["wall_s"] == 12.0 and status["attempts"] == 2


def test_the_run_imports_the_studys_mtft_whatever_the_working_directory_holds(tmp_path):
    """A decoy ``mtft`` package in the run's working directory (which ``python -m mtft`` would import first)."""
    decoy = tmp_path / "cwd"
    (decoy / "mtft").mkdir(parents=True)
    (decoy / "mtft" / "__init__.py").write_text("raise SystemExit('decoy mtft imported')\n")
    (tmp_path / "c.yaml").write_text("run: {name: x\n")  # broken YAML: the real mtft exits 2 with one error line
    outcome = job(tmp_path, cwd=str(decoy))()
    assert outcome["returncode"] == 2 and outcome["error"].startswith("error: "), outcome
    assert "decoy" not in (tmp_path / "logs" / "c.log").read_text()


def test_a_killed_attempt_does_not_carry_the_previous_attempts_error_line(tmp_path, monkeypatch):
    """A run SIGKILLed in a continued study: its log (appended over attempts) ends with the previous attempt's
    ``error:`` line, which is not this attempt's error."""
    log = tmp_path / "logs" / "c.log"
    log.parent.mkdir()
    log.write_text("$ python -m mtft --config c.yaml\nerror: the previous attempt's error\n")
    kill = "import os, signal; print('[mtft] step 3', flush=True); os.kill(os.getpid(), signal.SIGKILL)"
    monkeypatch.setattr(RunJob, "command", lambda self: [sys.executable, "-c", kill])
    outcome = job(tmp_path)()
    assert outcome["status"] == "failed" and outcome["error"] == "killed by SIGKILL; its last line: [mtft] step 3"
    assert read_status(tmp_path / "status" / "c.json")["error"] == outcome["error"]
