"""How the tests run ``run.py`` and other commands, and share the machine while they do.

- :func:`run_cli`: ``python run.py ARGS`` inside the test process (tests/helpers/in_process.py), for a test of
  what a run does; ``MTFT_TESTS_PROCESSES=1`` gives each a process of its own instead;
- :func:`launch_cli` / :func:`run_script`: ``python SCRIPT ARGS`` in a process of its own, for a test where the
  process is the point (a signal, an exit by a signal, a study's jobs, a process killed or stopped), forked from the
  test process's warm Python (:class:`WarmPython`, tests/helpers/warm_python.py) or, with ``MTFT_TESTS_COLD=1``, a
  fresh interpreter;
- :func:`run_torchrun`: ``torchrun --nproc_per_node N run.py ARGS``;
- :func:`run_process`: any command, killed with every process below it on a timeout.

Several test processes (pytest-xdist workers) share the machine: each single-process launch gets :data:`THREADS`
threads (the cores divided among the workers), and launches of several processes (torchrun, the DeepSpeed
launcher, a study running two jobs at a time) go one at a time (:class:`OneAtATime`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from tests.helpers.warm_client import Handover

REPO = Path(__file__).resolve().parents[2]
_DISTRIBUTED_VARS = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}

#: threads of a single-process launch: this machine's cores shared among the test processes (pytest-xdist)
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
THREADS = max(1, (os.cpu_count() or 1) // WORKERS)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _DISTRIBUTED_VARS}
    env.update(extra)
    return env


# ----- multi-process launches, one at a time ------------------------------------------------------------
class OneAtATime:
    """A lock over every test process of the session (``flock`` on one file; nothing to lock without workers) that
    multi-process launches hold: two of them side by side would put four busy processes on two cores. A
    single-process launch takes no lock: beside a two-rank launch it makes three processes on two cores, which share
    them fairly (measured: a 12-step two-process LF-MLF run took 10.7 s alone and 15.6 s beside a training run, the
    1.5x of a fair share) instead of leaving a core idle. A process that holds the lock takes nothing more for the
    launches inside it."""

    def __init__(self) -> None:
        self.path: Path | None = None
        self.holding = False
        self.held_s = 0.0  # how long this test process held it: the part of the suite that runs one at a time

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        if self.path is None or self.holding:
            yield
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self.holding, start = True, time.perf_counter()
            yield
        finally:
            if self.holding:
                self.held_s += time.perf_counter() - start
            self.holding = False
            os.close(fd)  # releases the lock


MULTIPROCESS = OneAtATime()


# ----- processes --------------------------------------------------------------------------------------------
def run_process(
    command: list[str], env: dict[str, str], timeout: float = 600, processes: int = 1
) -> subprocess.CompletedProcess:
    """``subprocess.run`` from the repository root that, on a timeout (``timeout`` here, or pytest-timeout's alarm
    in the test) or Ctrl-C, kills the child and every process below it: torchrun's ranks too, so that no orphaned
    rank is left waiting in a collective. ``processes`` > 1 (a launcher's ranks) waits for the other multi-process
    launches of the session."""
    with MULTIPROCESS.hold() if processes > 1 else contextlib.nullcontext():
        with subprocess.Popen(
            command,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        ) as process:
            try:
                stdout, stderr = process.communicate(timeout=timeout)
            except BaseException:
                kill_tree(process.pid)
                process.wait(timeout=60)
                raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def kill_tree(pid: int) -> None:
    """SIGKILL process ``pid`` (the leader of its own process group) and all its descendants. Killing the group is
    not enough: torchrun starts every rank in a session of its own, and a rank whose torchrun is gone is orphaned
    (reparented to init) where nothing finds it again; so the tree is listed first, with the leader stopped so
    that it starts no new process meanwhile, then each member's group is killed."""
    import psutil  # a dependency of DeepSpeed

    try:
        os.kill(pid, signal.SIGSTOP)
        members = psutil.Process(pid).children(recursive=True)
    except (ProcessLookupError, psutil.NoSuchProcess):
        members = []
    for target in [pid, *(member.pid for member in members)]:
        for kill in (os.killpg, os.kill):  # the member's group (a rank's own helpers), then the member itself
            try:
                kill(target, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def run_ranks(worker, args: tuple, nprocs: int) -> None:
    """``torch.multiprocessing.spawn(worker, args, nprocs)`` with the ranks forked from this test process instead of
    started as fresh interpreters: no 3-8 s of imports per rank (the unit tests' gloo ranks, 94 s spawned, 13 s
    forked). Sound because this process has no process group to leak into the ranks (checked) and each rank computes
    with one thread (set first: an OpenMP pool the test process used is not carried over a fork); ``worker`` runs
    as under ``spawn``: ``worker(rank, *args)``, a rank's exception raised here with its traceback."""
    import torch.distributed as dist
    import torch.multiprocessing as mp

    assert not dist.is_initialized(), "a process group in the test process would leak into forked ranks"
    mp.start_processes(_one_thread, args=(worker, args), nprocs=nprocs, join=True, start_method="fork")


def _one_thread(rank: int, worker, args: tuple) -> None:
    import torch

    torch.set_num_threads(1)
    worker(rank, *args)


def run_cli(*args: str, threads: int = THREADS, timeout: float = 600, **env: str) -> subprocess.CompletedProcess:
    """``python run.py ARGS`` from the repository root, run inside the test process (tests/helpers/in_process.py):
    for a test of what a run does, not of the process it runs in. ``MTFT_TESTS_PROCESSES=1`` launches each in a
    process of its own (:func:`launch_cli`) instead: the check that running in-process changes nothing. ``timeout``
    limits a launched run; one in the test process is under the test's own limit (pytest-timeout)."""
    if os.environ.get("MTFT_TESTS_PROCESSES") == "1":
        return launch_cli(*args, threads=threads, timeout=timeout, **env)
    from tests.helpers.in_process import run_in_process

    start = time.perf_counter()
    result = run_in_process(list(args), clean_env(OMP_NUM_THREADS=str(threads), **env), threads, REPO)
    log_launch("run.py", list(args), time.perf_counter() - start, in_process=True)
    return result


def launch_cli(
    *args: str, threads: int = THREADS, timeout: float = 600, processes: int = 1, **env: str
) -> subprocess.CompletedProcess:
    """``python run.py ARGS`` from the repository root in a process of its own: for a test where the process is the
    point (a signal, an exit status a signal sets, a study's jobs, a process killed or stopped)."""
    return run_script("run.py", *args, threads=threads, timeout=timeout, processes=processes, **env)


def run_script(
    script: str, *args: str, threads: int = THREADS, timeout: float = 600, processes: int = 1, **env: str
) -> subprocess.CompletedProcess:
    """``python SCRIPT ARGS`` from the repository root with ``threads`` threads: forked from the warm Python, or
    (``MTFT_TESTS_COLD=1``, or before the session started it) a fresh interpreter. ``processes`` > 1 (a study whose
    runs go two at a time) waits for the other multi-process launches of the session."""
    environment = clean_env(OMP_NUM_THREADS=str(threads), **env)
    if WARM.folder is None:
        return run_process([sys.executable, script, *args], environment, timeout, processes)
    with MULTIPROCESS.hold() if processes > 1 else contextlib.nullcontext():
        return WARM.run(script, list(args), environment, threads, timeout)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_torchrun(*args: str, nproc: int = 2, timeout: float = 600) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node=NPROC run.py ARGS`` on a free local port, one thread per rank; a timeout kills
    every rank."""
    torchrun = [f"--nproc_per_node={nproc}", f"--master_port={free_port()}", "run.py", *args]
    return run_launcher("torch.distributed.run", *torchrun, timeout=timeout)


def run_launcher(module: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m MODULE ARGS`` for a launcher of several processes (torchrun's ``torch.distributed.run``,
    DeepSpeed's ``deepspeed.launcher.runner``), one thread per process, waiting for the session's other
    multi-process launches; a timeout kills every process it started. The launcher is forked from the warm Python,
    and so are the processes it starts with ``sys.executable`` (tests/helpers/warm_client.py)."""
    environment = clean_env(OMP_NUM_THREADS="1")
    with MULTIPROCESS.hold():
        if WARM.folder is None:
            return run_process([sys.executable, "-m", module, *args], environment, timeout)
        return WARM.run(module, list(args), environment, 1, timeout, module=True)


def log_launch(script: str, argv: list[str], seconds: float, in_process: bool = False) -> None:
    """With ``MTFT_TESTS_LAUNCH_LOG=FILE`` (bench/test_suite.py sets it), one JSON line per run, in-process or
    warm: the test, the command and its seconds, the part of a test's time that its runs are."""
    path = os.environ.get("MTFT_TESTS_LAUNCH_LOG")
    if path:
        line = {"test": os.environ.get("PYTEST_CURRENT_TEST", ""), "command": [script, *argv], "seconds": seconds}
        line["in_process"] = in_process
        with open(path, "a") as log:
            log.write(json.dumps(line) + "\n")


# ----- the warm Python --------------------------------------------------------------------------------------
class WarmPython:
    """The test process's warm Python (tests/helpers/warm_python.py, where why it is sound is said): a server
    that has imported the heavy libraries once and forks a fresh ``python SCRIPT ARGS`` per launch, saving the ~3 s
    of imports that most of a short run's time is. Started at its first launch (a session of unit tests never
    starts it), in :attr:`folder` (set by tests/conftest.py; ``None``: launches are fresh interpreters)."""

    def __init__(self) -> None:
        self.folder: Path | None = None
        self.server: subprocess.Popen | None = None
        self.launches = 0

    def start(self) -> None:
        assert self.folder is not None
        with open(self.folder / "server.log", "w") as log:
            self.server = subprocess.Popen(
                [sys.executable, str(REPO / "tests/helpers/warm_python.py"), *self.paths()],
                cwd=REPO,
                env=clean_env(OMP_NUM_THREADS="1"),
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                start_new_session=True,
            )
        assert self.server.stdout is not None
        if self.server.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the warm Python did not start: {(self.folder / 'server.log').read_text()[-3000:]}")

    def paths(self) -> tuple[str, str]:
        """The server's socket, and the ``sys.executable`` its launches see (tests/helpers/warm_client.py)."""
        assert self.folder is not None
        return str(self.folder / "warm.sock"), str(self.folder / "python")

    def run(
        self, script: str, argv: list[str], env: dict[str, str], threads: int, timeout: float, module: bool = False
    ) -> subprocess.CompletedProcess:
        """``python SCRIPT ARGV`` (``python -m SCRIPT ARGV`` with ``module``) in a fresh fork."""
        assert self.folder is not None
        if self.server is None or self.server.poll() is not None:
            self.start()
        self.launches += 1
        stdout, stderr = (self.folder / f"{self.launches}.{name}" for name in ("out", "err"))
        kind = "module" if module else "script"
        request = {kind: script, "argv": argv, "env": env, "cwd": str(REPO), "threads": threads, "unbuffered": False}
        with contextlib.ExitStack() as files:
            streams = [files.enter_context(open(os.devnull, "rb"))]
            streams += [files.enter_context(open(path, "wb")) for path in (stdout, stderr)]
            run = Handover(self.paths()[0], request, [stream.fileno() for stream in streams])
        start = time.perf_counter()
        try:  # the run has its own copies of the streams
            status = run.status(timeout)
        except BaseException:  # the timeout here, pytest-timeout's alarm or Ctrl-C: no process left behind
            kill_tree(run.pid)
            raise
        finally:
            run.close()
        result = subprocess.CompletedProcess([script, *argv], status, stdout.read_text(), stderr.read_text())
        log_launch(script, argv, time.perf_counter() - start)
        stdout.unlink()
        stderr.unlink()
        return result

    def stop(self) -> None:
        if self.server is not None:
            kill_tree(self.server.pid)
            self.server.wait(timeout=60)
        self.server, self.folder = None, None


WARM = WarmPython()
