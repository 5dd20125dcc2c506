"""Resume that trusts nothing it has not checked: damaged or planted checkpoint files, a torn metrics log, a kill
while best/ was being replaced, SIGTERM / Ctrl-C, and two runs into one directory (mtft.training.checkpoint,
mtft.core.runlock). Every resumed run must end with the weights of the uninterrupted run."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers.launch import REPO, WARM, clean_env, kill_tree, run_cli, run_script, run_torchrun
from tests.helpers.runs import BASE_CONFIG, base_overrides, read_jsonl
from tests.helpers.warm_client import Handover

pytestmark = pytest.mark.slow

STEPS = 6
RUN = {"checkpointing.every_steps": 2, "checkpointing.keep_last": 3, "evaluation.every_steps": 2}


def args(out: Path) -> list[str]:
    return ["--config", BASE_CONFIG, *base_overrides(out, STEPS, **RUN)]


def step_name(step: int) -> str:
    return f"step-{step:08d}"


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("straight") / "run"
    result = run_cli(*args(out))
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [step_name(2), step_name(4), step_name(6)]
    return out


def copy_of(straight: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(straight, out)
    config = out / "config.yaml"  # the copy is a run of its own output directory
    config.write_text(config.read_text().replace(str(straight), str(out)))
    return out


def assert_same_final_run(out: Path, straight: Path) -> None:
    expected = load_file(str(straight / "checkpoints" / step_name(STEPS) / "model.safetensors"))
    got = load_file(str(out / "checkpoints" / step_name(STEPS) / "model.safetensors"))
    assert expected.keys() == got.keys()
    for key in expected:
        assert torch.equal(expected[key], got[key]), key
    # each logged row once, in the uninterrupted run's order
    rows = [(e["step"], e["kind"]) for e in read_jsonl(out / "metrics.jsonl")]
    assert rows == [(e["step"], e["kind"]) for e in read_jsonl(straight / "metrics.jsonl")]


def resume(out: Path) -> subprocess.CompletedProcess:
    return run_cli(*args(out), "--resume")


def warnings_about(stderr: str, text: str) -> list[str]:
    return [line for line in stderr.splitlines() if text in line]


def rewrite_marker_entry(checkpoint: Path, name: str) -> None:
    """Record ``name``'s current size and SHA-256 in the checkpoint's marker, as an attacker could."""
    marker = json.loads((checkpoint / "COMPLETE").read_text())
    data = (checkpoint / name).read_bytes()
    marker["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (checkpoint / "COMPLETE").write_text(json.dumps(marker))


def _delete_engine(latest: Path) -> str:
    shutil.rmtree(latest / "engine")
    return "engine/mp_rank_00_model_states.pt is missing"


def _truncate_engine(latest: Path) -> str:
    file = latest / "engine/mp_rank_00_model_states.pt"
    file.write_bytes(file.read_bytes()[:1000])
    return "engine/mp_rank_00_model_states.pt has 1000 bytes"


def _garbage_engine(latest: Path) -> str:
    """Garbage of the right size, the marker rewritten to match: only the loader itself can refuse it."""
    name = "engine/mp_rank_00_model_states.pt"
    file = latest / name
    file.write_bytes(bytes(range(256)) * (file.stat().st_size // 256) + b"x" * (file.stat().st_size % 256))
    rewrite_marker_entry(latest, name)
    return "mp_rank_00_model_states.pt cannot be loaded safely"


def _garbage_trainer_state(latest: Path) -> str:
    (latest / "trainer_state.json").write_text("{not json")
    return "trainer_state.json has 9 bytes"


def _truncate_weights(latest: Path) -> str:
    file = latest / "model.safetensors"
    file.write_bytes(file.read_bytes()[:-10])
    return "model.safetensors has"


@pytest.mark.parametrize(
    "damage", [_delete_engine, _truncate_engine, _garbage_engine, _garbage_trainer_state, _truncate_weights]
)
def test_damaged_latest_checkpoint_falls_back_to_the_previous_one(straight, tmp_path, damage):
    out = copy_of(straight, tmp_path)
    reason = damage(out / "checkpoints" / step_name(6))
    result = resume(out)
    assert result.returncode == 0, result.stderr[-3000:]
    warning = warnings_about(result.stderr, "is damaged")
    assert len(warning) == 1 and reason in warning[0] and f"falling back to {step_name(4)}" in warning[0], warning
    assert f"resumed from {out}/checkpoints/{step_name(4)} at step 4" in result.stderr
    assert_same_final_run(out, straight)


class _Planted:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "pwned"))


def test_planted_pickle_is_never_unpickled(straight, tmp_path):
    out = copy_of(straight, tmp_path)
    latest = out / "checkpoints" / step_name(6)
    planted = tmp_path / "PWNED"
    name = "engine/mp_rank_00_model_states.pt"
    torch.save({"module": _Planted(planted)}, latest / name)
    pickle.loads(pickle.dumps(_Planted(tmp_path / "check")))  # the payload does run when unpickled
    assert (tmp_path / "check").read_text() == "pwned"
    rewrite_marker_entry(latest, name)  # the marker agrees: only the loader itself can refuse the file
    result = resume(out)
    assert result.returncode == 0, result.stderr[-3000:]
    assert not planted.exists()
    warning = warnings_about(result.stderr, "is damaged")
    assert len(warning) == 1 and "cannot be loaded safely" in warning[0] and step_name(4) in warning[0], warning
    assert_same_final_run(out, straight)


def test_no_intact_checkpoint_is_one_error_line(straight, tmp_path):
    out = copy_of(straight, tmp_path)
    for step in (2, 4, 6):
        (out / "checkpoints" / step_name(step) / "trainer_state.json").write_text("garbage")
    result = resume(out)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: cannot resume {out}: no intact checkpoint")
    assert "Traceback" not in result.stderr


def snapshot(folder: Path) -> dict[str, tuple]:
    """Every path under ``folder`` with its size, modification time and SHA-256 (files) -- what a refused command
    must leave exactly as it was."""
    state = {}
    for path in sorted(folder.rglob("*")):
        stat = path.stat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "folder"
        state[str(path.relative_to(folder))] = (stat.st_size if path.is_file() else 0, stat.st_mtime_ns, digest)
    return state


def _all_unloadable(out: Path) -> None:
    """Every checkpoint's engine state cut short, with markers that agree: only loading it, after DeepSpeed has
    started and the run has logged, finds the damage."""
    for step in (2, 4, 6):
        checkpoint = out / "checkpoints" / step_name(step)
        _truncate_engine(checkpoint)
        rewrite_marker_entry(checkpoint, "engine/mp_rank_00_model_states.pt")


def _all_damaged(out: Path) -> None:
    for step in (2, 4, 6):
        (out / "checkpoints" / step_name(step) / "trainer_state.json").write_text("garbage")


REFUSED_RESUMES = {
    "config-differs": (None, ["training.optimizer.lr=5e-3"], "the config differs at training.optimizer.lr"),
    "bad-override": (None, ["training.colour=blue"], "unknown key 'training.colour'"),
    "all-checkpoints-damaged": (_all_damaged, [], "no intact checkpoint"),
    "no-checkpoint-loads": (_all_unloadable, [], "no intact checkpoint"),
}


@pytest.mark.parametrize("case", sorted(REFUSED_RESUMES))
def test_refused_resume_leaves_no_trace(straight, tmp_path, case):
    """Not a byte of the run directory changes -- config.yaml, train.log, metrics.jsonl, best/ -- and no file
    appears, however late the resume is refused."""
    damage, overrides, message = REFUSED_RESUMES[case]
    out = copy_of(straight, tmp_path)
    if damage is not None:
        damage(out)
    time.sleep(0.01)  # a file rewritten with the same bytes would still show a new modification time
    before = snapshot(out)
    result = run_cli(*args(out), *overrides, "--resume")
    assert result.returncode == 2, result.stderr[-3000:]
    assert message in result.stderr.strip().splitlines()[-1] and "Traceback" not in result.stderr
    assert snapshot(out) == before
    assert [p.name for p in tmp_path.iterdir()] == ["run"]  # nor beside it (the run lock's file)


def test_torn_log_line_and_a_kill_while_replacing_best(straight, tmp_path):
    out = copy_of(straight, tmp_path)
    with (out / "metrics.jsonl").open("a") as handle:
        handle.write('{"step": 6, "kind": "tra')  # a power cut while appending
    best = (out / "best/model.safetensors").read_bytes()
    os.replace(out / "best", out / "best.previous")  # killed between the two renames of a best/ replacement
    result = resume(out)  # the finished run, from its last checkpoint: nothing is repeated
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(warnings_about(result.stderr, "dropped 1 unreadable line(s)")) == 1
    assert (out / "best/model.safetensors").read_bytes() == best and not (out / "best.previous").exists()
    assert_same_final_run(out, straight)


def test_resume_before_the_first_checkpoint_says_so(straight, tmp_path):
    out = copy_of(straight, tmp_path)
    shutil.rmtree(out / "checkpoints")
    result = resume(out)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(warnings_about(result.stderr, "has no complete checkpoint yet; starting from step 0")) == 1
    assert_same_final_run(out, straight)


@pytest.mark.parametrize("name, code", [("SIGTERM", 143), ("SIGINT", 130)])
def test_signal_saves_and_resume_matches(straight, tmp_path, name, code):
    out = tmp_path / "run"
    stopped = run_script("tests/helpers/signal_during_run.py", name, "3", *args(out))
    assert stopped.returncode == code, stopped.stderr[-3000:]
    last = stopped.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: stopped by {name} after step 3; checkpoint {out}/checkpoints/{step_name(3)}"), last
    assert last.endswith("--resume") and "continue with: python run.py --config tests/e2e/base.yaml" in last
    assert "Traceback" not in stopped.stderr
    assert (out / "checkpoints" / step_name(3) / "COMPLETE").is_file()
    result = resume(out)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"resumed from {out}/checkpoints/{step_name(3)} at step 3" in result.stderr
    expected = load_file(str(straight / "checkpoints" / step_name(STEPS) / "model.safetensors"))
    got = load_file(str(out / "checkpoints" / step_name(STEPS) / "model.safetensors"))
    assert all(torch.equal(expected[k], got[k]) for k in expected) and expected.keys() == got.keys()
    assert json.loads((out / "metrics.json").read_text()) == json.loads((straight / "metrics.json").read_text())


class Started:
    """``python run.py ARGV`` started and not waited for, with one thread, its error output kept: forked from the
    warm Python (tests/helpers/launch.py), whose answer is the run's own pid, or (``MTFT_TESTS_COLD=1``) a fresh
    interpreter."""

    def __init__(self, argv: list[str], folder: Path) -> None:
        self.stderr_path, env = folder / "started.err", clean_env(OMP_NUM_THREADS="1")
        with contextlib.ExitStack() as files:
            stdin, stdout = (files.enter_context(open(os.devnull, mode)) for mode in ("rb", "wb"))
            stderr = files.enter_context(open(self.stderr_path, "wb"))
            if WARM.folder is None:
                self.run = subprocess.Popen(
                    [sys.executable, "run.py", *argv], cwd=REPO, stdin=stdin, stdout=stdout, stderr=stderr, env=env
                )
            else:
                if WARM.server is None or WARM.server.poll() is not None:
                    WARM.start()
                request = {"script": "run.py", "argv": argv, "env": env, "cwd": str(REPO), "threads": 1}
                request["unbuffered"] = False
                self.run = Handover(WARM.paths()[0], request, [stdin.fileno(), stdout.fileno(), stderr.fileno()])
        self.pid = self.run.pid

    def wait(self, timeout: float) -> tuple[int, str]:
        """The run's exit status and error output, once it has ended."""
        if isinstance(self.run, subprocess.Popen):
            status = self.run.wait(timeout)
        else:
            try:
                status = self.run.status(timeout)
            except BaseException:
                kill_tree(self.pid)
                raise
            finally:
                self.run.close()
        return status, self.stderr_path.read_text()


def test_second_run_into_a_live_run_directory_is_refused(tmp_path):
    """A second run into a directory whose run is alive is refused at once, naming it, and the first run ends
    unharmed. The first is stopped (SIGSTOP) from the moment its lock is written until the second has been refused:
    alive and holding the lock however fast it trains or however slow the machine is, so a 2-step run serves
    (a 200-step one, left running, was most of this test's time)."""
    out, logs = tmp_path / "run", tmp_path / "logs"
    logs.mkdir()
    short = [*args(out), "training.max_steps=2"]
    first = Started(short, logs)
    try:
        lock = tmp_path / ".run.lock"
        deadline = time.time() + 120
        while not (lock.is_file() and lock.read_text().strip()) and time.time() < deadline:
            time.sleep(0.05)
        os.kill(first.pid, signal.SIGSTOP)
        try:
            assert json.loads(lock.read_text())["pid"] == first.pid
            started = time.time()
            second = run_cli(*short, "--resume", threads=1)  # refused while the first holds the lock: it is alive
            took = time.time() - started
        finally:
            os.kill(first.pid, signal.SIGCONT)
    finally:
        status, stderr = first.wait(timeout=600)
    assert second.returncode == 2, second.stderr[-3000:]
    assert took < 60 and "Traceback" not in second.stderr
    assert (
        second.stderr.strip().splitlines()[-1].startswith(f"error: {out} is in use by another run (pid {first.pid} on ")
    )
    assert status == 0, stderr[-3000:]
    assert (out / "checkpoints" / step_name(2) / "COMPLETE").is_file()


def test_zero2_engine_state_resumes_through_the_safe_loader(tmp_path):
    """ZeRO 1/2 keep the optimizer state in their own file, with three DeepSpeed classes in it (see
    checkpoint._safe_globals): resuming from it must load (weights_only) and stay bit-identical. The resumed run is a
    copy of the uninterrupted one (the same run: training is deterministic) without its last checkpoint."""
    zero2 = ["training.deepspeed_config=configs/deepspeed/zero2.json", "training.max_steps=4"]
    straight = tmp_path / "straight"
    result = run_cli(*args(straight), *zero2)
    assert result.returncode == 0, result.stderr[-3000:]
    out = copy_of(straight, tmp_path)
    assert any(p.name.startswith("zero_pp_rank_0") for p in (out / "checkpoints" / step_name(4) / "engine").iterdir())
    shutil.rmtree(out / "checkpoints" / step_name(4))  # as if the run had stopped after step 2's checkpoint
    result = run_cli(*args(out), *zero2, "--resume")
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"resumed from {out}/checkpoints/{step_name(2)} at step 2" in result.stderr
    expected = load_file(str(straight / "checkpoints" / step_name(4) / "model.safetensors"))
    got = load_file(str(out / "checkpoints" / step_name(4) / "model.safetensors"))
    assert expected.keys() == got.keys() and all(torch.equal(expected[k], got[k]) for k in expected)


def _tree(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_resume_with_another_process_count_is_refused_before_anything_loads(tmp_path):
    """A run of 2 processes resumed by 1, and one of 1 process resumed by 2 (its last checkpoint): one error line
    naming both counts (on every rank), exit 2, no rank says it resumed, and the run directory is left byte for
    byte."""
    extra = {"checkpointing.every_steps": 2, "evaluation.every_steps": None, "training.micro_batch_size": 8}
    two = tmp_path / "two"
    result = run_torchrun("--config", BASE_CONFIG, *base_overrides(two, 4, **extra))
    assert result.returncode == 0, result.stderr[-3000:]
    before = _tree(two)
    result = run_cli("--config", BASE_CONFIG, *base_overrides(two, 4, **extra), "--resume")
    assert result.returncode == 2, result.stderr[-3000:]
    assert "saved by 2 process(es) and this resume runs 1" in result.stderr and "resumed from" not in result.stdout
    assert "Traceback" not in result.stderr and _tree(two) == before

    one = tmp_path / "one"
    result = run_cli("--config", BASE_CONFIG, *base_overrides(one, 4, **extra))
    assert result.returncode == 0, result.stderr[-3000:]
    before = _tree(one)
    result = run_torchrun("--config", BASE_CONFIG, *base_overrides(one, 4, **extra), "--resume")
    assert result.returncode != 0
    # every rank refuses before DeepSpeed; the node's first process prints the line (torchrun's report may repeat it)
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "saved by 1 process(es) and this resume runs 2" in lines[0]
    assert "resumed from" not in result.stdout + result.stderr and _tree(one) == before


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "stage, saved, resumed", [(1, 1, 2), (2, 1, 2), (2, 2, 1), (3, 1, 2), (3, 2, 1)], ids=lambda v: str(v)
)
def test_resume_with_another_process_count_is_refused_under_every_zero_stage(tmp_path, stage, saved, resumed):
    """ZeRO-1/2/3 partition the optimizer state (ZeRO-3 the weights too) by the process count: the same refusal
    as under ZeRO-0, one line (printed once), a non-zero exit, before any rank loads anything or says it resumed."""
    extra = {
        "checkpointing.every_steps": 2,
        "evaluation.every_steps": None,
        "weighting.method": "mean",
        "training.deepspeed_config": f"configs/deepspeed/zero{stage}.json",
    }
    args = ["--config", BASE_CONFIG, *base_overrides(tmp_path / "run", 2, **extra)]
    launch = {1: lambda *a: run_cli(*a, timeout=240), 2: lambda *a: run_torchrun(*a, timeout=240)}
    result = launch[saved](*args)
    assert result.returncode == 0, result.stderr[-3000:]
    # the libraries' per-rank noise comes once (DeepSpeed's op line) or not at all (torch's deprecation notices
    # of the collectives ZeRO calls: hundreds of lines under ZeRO-3)
    assert result.stdout.count("shm_comm_op built") <= 1 and "FutureWarning" not in result.stderr, result.stderr
    before = _tree(tmp_path / "run")
    result = launch[resumed](*args, "--resume")
    assert result.returncode != 0
    refusal = f"saved by {saved} process(es) and this resume runs {resumed}"
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and refusal in lines[0], result.stderr
    assert result.stderr.count("error:") == 1 and "Traceback" not in result.stderr.split("error:")[0]
    assert "resumed from" not in result.stdout + result.stderr and _tree(tmp_path / "run") == before
