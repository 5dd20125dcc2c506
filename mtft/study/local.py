"""The local executor: N runs at a time as child processes, threads per run so that workers × threads ≤ cores.

Ctrl-C (or SIGTERM) stops cleanly: no new run starts, the running ones receive SIGTERM, write a checkpoint and exit,
and the study's next invocation resumes them. If the study process is killed outright, its runs get SIGTERM from the
kernel (see :func:`mtft.study.jobs._end_with_parent`) and do the same.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, Callable, Iterator

from tqdm import tqdm

from mtft.core.errors import Interrupted
from mtft.study.jobs import RunJob


def default_threads(workers: int) -> int:
    return max(1, (os.cpu_count() or 1) // workers)


def run_local(jobs: list[RunJob], workers: int, on_result: Callable[[dict[str, Any]], None]) -> None:
    """Run ``jobs``, ``workers`` at a time; ``on_result`` sees each outcome as it comes. Raises
    :class:`~mtft.core.errors.Interrupted` after a clean stop on Ctrl-C / SIGTERM."""
    stop = threading.Event()
    queue = list(jobs)
    running: dict[Future, RunJob] = {}
    bar = tqdm(total=len(jobs), unit="run", desc="study", dynamic_ncols=True)
    failed = 0
    signalled: set[int] = set()
    with _stop_on_signals(stop) as received, ThreadPoolExecutor(max_workers=workers) as pool:
        while queue or running:
            while queue and len(running) < workers and not stop.is_set():
                job = queue.pop(0)
                running[pool.submit(job)] = job
            if not running:
                break
            done, _ = wait(list(running), timeout=0.5, return_when=FIRST_COMPLETED)
            if stop.is_set():
                _terminate_children(signalled)
            for future in done:
                running.pop(future)
                result = future.result()
                failed += result["status"] == "failed"
                bar.set_postfix(failed=failed)
                bar.update(1)
                on_result(result)
    bar.close()
    if received:
        stopped = Interrupted(
            received[0],
            step=0,
            checkpoint=None,
            message=f"study stopped by {received[0]}: {len(queue)} runs not started, the interrupted ones saved "
            "a checkpoint",
        )
        stopped.resume_flag = False
        stopped.continue_in = os.getcwd()  # the study's relative paths and its runs' resolve against it
        raise stopped


@contextlib.contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[list[str]]:
    received: list[str] = []

    def handler(signum, frame):
        if not received:
            received.append(signal.Signals(signum).name)
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _terminate_children(signalled: set[int]) -> None:
    """SIGTERM, once, to every run still going: it finishes its step, checkpoints and exits 143 (a second signal
    would end it at once, without a checkpoint)."""
    import psutil

    for child in psutil.Process().children(recursive=False):
        if child.pid not in signalled:
            signalled.add(child.pid)
            with contextlib.suppress(psutil.NoSuchProcess):
                child.send_signal(signal.SIGTERM)
