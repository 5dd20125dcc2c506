"""Where a command's output may land: the one output-path policy of every command that writes a user-named file
or folder (``predict --out``, ``evaluate --out``, ``export --out``, ``probe --out``).

A user names the output; mtft writes there and nowhere else, and never over something the user did not mean:

- the name itself must not be a symbolic link (a link planted at ``--out`` would send the write elsewhere);
  the folder it lies in must exist and is resolved once, so every later check and the write see the same place;
- never one of the command's inputs (``predict --out`` = ``--input`` would replace the input with predictions),
  compared by inode too, so a hard link or another spelling of the same file is caught;
- never inside a run folder (its layout is the run's: a file there is read as the run's own, and checkpoint
  rotation replaces what lies there);
- a file is never replaced unless the command says so (``overwrite``); a folder must be missing or empty;
- the content goes to a private temporary of an unpredictable name beside the output (``mkstemp``: created
  exclusively, so a link planted at a temporary name is never followed), flushed, then put in place in one step:
  ``link`` for a new file (which fails rather than replace a file that appeared meanwhile), ``rename`` for a
  replaced file or a folder (a folder's rename fails on a non-empty folder that appeared meanwhile);
- a second writer of the same output is refused while the first holds it (an ``flock`` on a lock file beside it,
  removed at the end), and the checks run again under the lock.

Every refusal is one :class:`~mtft.core.errors.CheckpointError` line naming the option and the path.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterator, Sequence, Union

from mtft.core.atomic import AtomicFolder, private_temporary, raise_if_disk_full
from mtft.core.errors import CheckpointError

PathLike = Union[str, Path]


@dataclass(frozen=True)
class OutputPolicy:
    """What ``path`` (named by ``option``) must not be: one of ``inputs``, or inside one of ``runs``."""

    option: str = "--out"
    inputs: Sequence[PathLike] = ()
    runs: Sequence[PathLike] = ()

    def check_file(self, path: PathLike, overwrite: bool = False) -> Path:
        """``path`` as it will be written (its folder resolved), or one refusal line."""
        final = self._common(Path(path))
        if final.is_dir():
            raise self._refuse(path, "is a folder; name the file to write")
        if final.exists() and not overwrite:
            raise self._refuse(path, "exists; choose another name (mtft does not replace a file it was not told to)")
        return final

    def check_folder(self, path: PathLike) -> Path:
        """``path`` as it will be written (its parent resolved), or one refusal line: missing or empty only."""
        final = self._common(Path(path), folder=True)
        if final.exists() and (not final.is_dir() or any(final.iterdir())):
            raise self._refuse(path, "exists and is not empty; choose another")
        try:
            AtomicFolder(final).check()  # a <out>.partial / <out>.previous of the user's is never deleted
        except CheckpointError as error:
            raise self._refuse(path, f"cannot be written: {error}") from None
        return final

    def check_place(self, path: PathLike) -> Path:
        """``path`` (a folder to be made or kept, files written into it later) resolved, or one refusal line: no
        link at the name, not an input, not inside a run."""
        return self._common(Path(path), folder=True)

    @contextlib.contextmanager
    def writing_file(self, path: PathLike, overwrite: bool = False, binary: bool = False) -> Iterator[IO[Any]]:
        """A text (or ``binary``) handle on a private temporary; on success the file appears at ``path`` whole,
        else nothing."""
        final = self.check_file(path, overwrite)
        with _exclusive(final, self.option):
            final = self.check_file(path, overwrite)  # again, now that no other mtft writer can change it
            _remove_leftovers(final)
            fd, tmp = private_temporary(final)
            try:
                with os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8") as handle:
                    yield handle
                    handle.flush()
                    os.fsync(handle.fileno())
                self._put_file(Path(tmp), final, overwrite)
            except BaseException as exc:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise_if_disk_full(exc, final)
                raise

    @contextlib.contextmanager
    def writing_folder(self, path: PathLike, **description: str) -> Iterator[Path]:
        """A private folder to fill; on success it appears at ``path`` whole (with a completeness marker holding
        ``description``), else nothing."""
        final = self.check_folder(path)
        made = _make_parents(final.parent)  # a folder output may name folders still to be made: made now
        try:
            with _exclusive(final, self.option):
                final = self.check_folder(path)
                with AtomicFolder(final, replace=False).writing(**description) as partial:
                    yield partial
        except BaseException:
            for folder in reversed(made):  # nothing is left of a command that did not finish, its folders included
                with contextlib.suppress(OSError):
                    folder.rmdir()
            raise

    # ----------------------------------------------------------------------------------------------------------
    def _common(self, path: PathLike, folder: bool = False) -> Path:
        """``path`` with the folders above it resolved; a folder output may name folders still to be made."""
        path = Path(path)
        if path.name in ("", ".", ".."):
            raise self._refuse(path, "names no file or folder")
        if path.is_symlink():
            raise self._refuse(path, "is a symbolic link; mtft does not write through links")
        parent, missing = path.absolute().parent, []
        while folder and not parent.exists() and parent != parent.parent:
            parent, missing = parent.parent, [parent.name, *missing]
        if not parent.is_dir():
            raise self._refuse(path, f"no folder {parent}")
        final = parent.resolve().joinpath(*missing, path.name)
        for given in self.inputs:
            if _same(final, Path(given)):
                raise self._refuse(path, f"is an input of this command ({given}); write elsewhere")
        for run in self.runs:
            root = Path(run).resolve()
            if final == root or root in final.parents:
                raise self._refuse(path, f"is inside the run folder {run}, which the run owns; write elsewhere")
        return final

    def _put_file(self, tmp: Path, final: Path, overwrite: bool) -> None:
        if overwrite:
            os.replace(tmp, final)
            return
        try:
            os.link(tmp, final)  # never replaces: a file that appeared since the check is kept
        except FileExistsError:
            raise self._refuse(final, "appeared while this command was writing it; it was left as it is") from None
        os.unlink(tmp)

    def _refuse(self, path: PathLike, problem: str) -> CheckpointError:
        return CheckpointError(f"{self.option} {path} {problem}")


def _remove_leftovers(final: Path) -> None:
    """Temporaries of ``final`` left by a writer killed with SIGKILL (under the lock no live writer has one): the
    names :func:`~mtft.core.atomic.private_temporary` makes, plain files only."""
    pattern = re.compile(rf"\.{re.escape(final.name)}\.[a-z0-9_]{{8}}\.tmp")
    for entry in os.scandir(final.parent):
        if pattern.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)


def _same(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` name one file: the same resolved path, or the same inode (hard links)."""
    try:
        if a.resolve() == b.resolve():
            return True
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def _make_parents(folder: Path) -> list[Path]:
    """Make ``folder`` and the folders above it that are missing; returns those made, outermost first."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for made in reversed(missing):
        made.mkdir()
    return list(reversed(missing))


@contextlib.contextmanager
def _exclusive(final: Path, option: str) -> Iterator[None]:
    """Hold ``.<name>.lock`` beside ``final`` (never through a link), or refuse: another command writes it. The
    file is removed at the end; a writer that locked a file removed meanwhile sees another inode at the name
    and tries again (the usual check for lock files that are deleted)."""
    lock = final.with_name(f".{final.name}.lock")
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise CheckpointError(f"{option} {final}: {lock} is a symbolic link; move it away") from None
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise CheckpointError(
                f"{option} {final} is being written by another mtft command; wait for it or choose another"
            ) from None
        try:
            current = os.stat(lock, follow_symlinks=False).st_ino
        except FileNotFoundError:
            current = None
        if current == os.fstat(fd).st_ino:
            break
        os.close(fd)  # the file we locked was removed by the writer before us: lock the one at the name now
    try:
        yield
    finally:
        with contextlib.suppress(OSError):  # removed while held: a later writer makes a new one
            lock.unlink()
        os.close(fd)
