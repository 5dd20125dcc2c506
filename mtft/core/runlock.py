"""One process at a time in a run directory: an exclusive ``flock`` on ``<parent>/.<name>.lock``.

Two runs writing into one output directory would interleave their checkpoints and logs, and ``--resume`` of a
run that is still alive would train the same steps twice. The lock is taken before anything of the run is
written (the run directory itself may not exist yet, so the lock file lives beside it) and held until the process
ends; the kernel releases it when the process dies, however it dies, so a stale lock cannot block a resume. The file
holds the holder's pid, host and start time, for the refusal message; it is left in place once the run directory
exists (marked complete), and removed (with any folder made for it) when the run was refused before writing anything,
or when this process made the file and ended in an error (a refused ``--resume`` of a finished run adds no file).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Callable, Iterator

from mtft.core.atomic import is_complete
from mtft.core.errors import CheckpointError


def lock_path(run_dir: Path) -> Path:
    run_dir = Path(run_dir).absolute()
    return run_dir.parent / f".{run_dir.name}.lock"


@contextlib.contextmanager
def run_lock(run_dir: Path) -> Iterator[Path]:
    """Hold the run directory's lock for the ``with`` block, or raise one :class:`CheckpointError` naming the holder."""
    path = lock_path(run_dir)
    created = [folder for folder in [path.parent, *path.parent.parents] if not folder.exists()]
    path.parent.mkdir(parents=True, exist_ok=True)
    made_file = not path.exists()
    fd = _open_lock(path)
    locked = failed = False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CheckpointError(f"{run_dir} is in use by {_holder(path)}; wait for it to end or stop it") from None
        locked = True
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        try:
            yield path
        except BaseException:
            failed = True
            raise
    finally:
        if locked and not is_complete(Path(run_dir)):  # refused before it wrote its run directory: leave no trace
            _remove_trace(path, created)
        elif locked and failed and made_file:  # e.g. a refused --resume: the run directory is as it was, no file
            _remove_trace(path, [])
        os.close(fd)  # closing the descriptor releases the lock


@contextlib.contextmanager
def waiting_lock(path: Path, on_wait: Callable[[], None] = lambda: None) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path``, waiting for the holder if there is one (``on_wait`` is called once
    first): for work that concurrent runs share, such as filling one cache entry, which the first does and the
    others then reuse. The file stays (removing it would let a third process lock a different inode)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = _open_lock(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            on_wait()
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _open_lock(path: Path) -> int:
    """The lock file's descriptor, never through a link planted at its name (the holder's line is written into
    it: through a link it would overwrite a file of the user's)."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CheckpointError(f"{path} is a symbolic link; mtft does not write through links") from None
        raise


def _remove_trace(path: Path, created: list[Path]) -> None:
    """The lock file and the folders made for it, while the lock is still held (a process that opened the file
    before cannot take the lock: every attempt is non-blocking)."""
    with contextlib.suppress(OSError):
        path.unlink()
        for folder in created:  # innermost first
            folder.rmdir()


def _holder(path: Path) -> str:
    try:
        holder = json.loads(path.read_text(encoding="utf-8"))
        return f"another run (pid {holder['pid']} on {holder['host']}, started {holder['started']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another run"
