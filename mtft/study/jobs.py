"""One run of a study as a job object: the same callable runs under the local executor and inside a Slurm job.

The job launches ``python -m mtft --config <resolved config>`` (with ``--resume`` when the run directory already
exists) as a child process of the study's own interpreter, importing the study's own mtft (not one the working
directory may hold), sends its console output to the run's log, and records the outcome in the run's status
file. A run is a child process rather than a function call so that a crash, an ``os._exit`` or a leak in one run
cannot take the study down, and so that each run gets its own thread count and distributed environment.

Inside a Slurm job of several tasks (``nodes`` × ``tasks_per_node``, one task per GPU), every task runs this callable;
each becomes one rank of one DeepSpeed run, with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT taken from submitit's
:class:`submitit.helpers.TorchDistributedEnvironment` (the first node's host, a port derived from the job id).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from mtft.core.runlock import lock_path, waiting_lock
from mtft.core.version import code_version
from mtft.study.state import is_finished, is_started, record_attempt, record_launch

# variables of an enclosing launch that must not leak into a run's own distributed set-up
_LAUNCH_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")
_MTFT_ROOT = str(Path(__file__).resolve().parents[2])  # the folder that holds the mtft package
# ``python -m mtft`` would put the run's working directory first on sys.path, so an ``mtft`` folder there would be
# imported instead of the study's own; ``-c`` puts '' there, which this replaces with the study's package folder
_BOOT = (
    f"import sys; sys.path[0] = {_MTFT_ROOT!r}; from mtft.cli import entry_point; "
    "entry_point(sys.argv[1:], prog='python -m mtft')"
)
INTERRUPTED = (130, 143, -signal.SIGINT, -signal.SIGTERM)


@dataclass
class RunJob:
    """Train one (cell, seed) run to its end, resuming it if it was started before."""

    key: str  # <cell>/seed-<n>, for messages
    config_path: str
    run_dir: str
    log_path: str
    status_path: str
    cwd: str
    threads: Optional[int] = None
    env: dict[str, str] = field(default_factory=dict)
    distributed_from_submitit: bool = False

    def command(self) -> list[str]:
        resume = ["--resume"] if is_started(Path(self.run_dir)) else []
        return [*self.interpreter(), "--config", self.config_path, *resume]

    def interpreter(self) -> list[str]:
        """The study's own interpreter, importing the study's own mtft whatever the working directory holds."""
        return [sys.executable, "-c", _BOOT]

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_VARIABLES}
        # the run imports the very mtft the study imported (a checkout run as `python path/to/run.py` included)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_MTFT_ROOT, env.get("PYTHONPATH")]))
        env.update(self.env)
        if self.threads:
            env.update(OMP_NUM_THREADS=str(self.threads), MKL_NUM_THREADS=str(self.threads))
        if self.distributed_from_submitit:
            env.update(_submitit_ranks())
        return env

    def __call__(self) -> dict[str, Any]:
        if is_finished(Path(self.run_dir)):
            return {"key": self.key, "status": "finished", "returncode": 0, "error": None}
        rank = self.environment().get("RANK", "0")
        main = rank == "0"
        _wait_until_free(Path(self.run_dir))
        log = Path(self.log_path) if main else Path(self.log_path).with_suffix(f".rank{rank}.log")
        log.parent.mkdir(parents=True, exist_ok=True)
        code = code_version()  # what the run will import: the source as it is at launch
        if main:
            record_launch(Path(self.status_path), code, time.time())
        start = time.perf_counter()
        with open(log, "a", encoding="utf-8") as out:
            out.write(f"$ {shlex.join(self.command())}\n")
            out.flush()
            since = log.stat().st_size  # the log is appended over attempts: this attempt's output starts here
            process = subprocess.Popen(
                self.command(),
                cwd=self.cwd,
                env=self.environment(),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=_end_with_parent,
                start_new_session=True,  # a terminal's Ctrl-C reaches the study only, which stops its runs once
            )
            with _forward_termination(process):
                returncode = process.wait()
        seconds = time.perf_counter() - start
        if returncode == 0 and is_finished(Path(self.run_dir)):
            status, error = "finished", None
        elif returncode in INTERRUPTED:
            status, error = "interrupted", "stopped by a signal; the study's next run resumes it"
        else:
            status, error = "failed", error_line(log, since, returncode)
        if main:
            record_attempt(Path(self.status_path), status, returncode, seconds, error, code)
        return {"key": self.key, "status": status, "returncode": returncode, "error": error}

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """submitit's hook on preemption or time-out: requeue the same job; the run resumes from its checkpoint."""
        import submitit

        return submitit.helpers.DelayedSubmission(self)


def error_line(log: Path, since: int = 0, returncode: Optional[int] = None) -> str:
    """The attempt's own ``error:`` line, else its last line (a traceback's last line names the error); only what
    the attempt wrote from byte ``since`` on, never a previous attempt's line. A run killed by a signal (SIGKILL, the
    OOM killer) says so."""
    try:
        with open(log, "rb") as file:
            file.seek(since)
            text = file.read().decode("utf-8", errors="replace")
    except OSError:
        return "no output"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    if errors:
        return errors[-1][:300]
    if returncode is not None and returncode < 0:
        killed = f"killed by {_signal_name(-returncode)}"
        return (f"{killed}; its last line: {lines[-1]}" if lines else f"{killed}, with no output")[:300]
    return (lines[-1] if lines else "no output")[:300]


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _wait_until_free(run_dir: Path) -> None:
    """A run of a killed study may still be saving its checkpoint (it got SIGTERM when the study died): wait for
    it to let go of the run directory's lock, rather than fail on "in use by another run"."""
    lock = lock_path(run_dir)
    if lock.is_file():
        with waiting_lock(lock, lambda: print(f"[mtft] waiting for {run_dir} to be released", flush=True)):
            pass


def _end_with_parent() -> None:
    """In the child, before exec: receive SIGTERM when the study process dies, even by SIGKILL (Linux), so that a
    killed study leaves no orphan run training on (the run checkpoints and exits; the next study resumes it)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@contextlib.contextmanager
def _forward_termination(process: subprocess.Popen):
    """A SIGTERM to the job (Slurm's warning before the end of its time) reaches the run, which checkpoints."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield  # the local executor's worker threads: the study process forwards signals itself
        return

    def forward(signum, frame):
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signum)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _submitit_ranks() -> dict[str, str]:
    """This Slurm task's rank in the job's DeepSpeed run; nothing for a job of one task."""
    from submitit.helpers import TorchDistributedEnvironment

    dist = TorchDistributedEnvironment()
    if dist.world_size == 1:
        return {}
    return {
        "MASTER_ADDR": dist.master_addr,
        "MASTER_PORT": str(dist.master_port),
        "RANK": str(dist.rank),
        "WORLD_SIZE": str(dist.world_size),
        "LOCAL_RANK": str(dist.local_rank),
        "LOCAL_WORLD_SIZE": str(dist.local_world_size),
    }
