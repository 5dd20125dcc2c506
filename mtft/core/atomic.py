"""Folders that are either complete or invisible: the one way mtft writes a checkpoint, a run directory's set-up,
a pre-trained backbone, the best weights or an export.

A folder ``X`` is assembled as ``X.partial/``; when every file is in it, a ``COMPLETE`` marker is written (a JSON
object saying what the folder is), the files and the marker are flushed to disk (``fsync``), and the folder is
renamed to ``X`` in one ``rename``. A crash at any point leaves at most ``X.partial`` (ignored by readers, replaced
by the next writer). Replacing an existing ``X`` goes through ``X.previous``: ``X`` → ``X.previous``, ``X.partial``
→ ``X``, then ``X.previous`` is removed, so a crash between the two renames leaves a complete ``X.previous``
that :func:`recover` puts back. After :meth:`AtomicFolder.commit` returns, the folder survives a power loss
(the parent directory's entry is flushed too). A full disk while writing or committing removes the partial folder and
raises :class:`~mtft.core.errors.DiskFullError` ("no space left on <folder>"): nothing half-written looks complete.

Only what mtft wrote is ever deleted or moved: the first file of every ``X.partial`` is a stamp (:data:`STAMP`, a
small JSON object), removed only after the marker is written, so a leftover of a killed attempt always holds the
stamp or the marker (or nothing). A leftover ``X.partial`` or ``X.previous`` holding neither -- a folder of the
user's that happens to have that name -- is never removed: :meth:`AtomicFolder.check` refuses with one
:class:`~mtft.core.errors.CheckpointError` line, and :func:`recover` leaves it alone.

Several processes may write into the same ``X.partial`` (each rank its own files); one of them begins and
commits, the others wait at barriers around it (see :mod:`mtft.training.checkpoint`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator, Optional

from mtft.core.errors import CheckpointError, DiskFullError

MARKER = "COMPLETE"
STAMP = ".mtft-partial"  # in X.partial from its creation until its marker is written; never in X


def is_complete(folder: Path) -> bool:
    """Whether ``folder`` was written completely by :class:`AtomicFolder`."""
    return (Path(folder) / MARKER).is_file()


def marker(folder: Path) -> dict[str, Any]:
    """The contents of ``folder``'s completeness marker ({} for a marker of an older plain-text form)."""
    try:
        value = json.loads((Path(folder) / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def written_by_mtft(folder: Path) -> bool:
    """Whether ``folder`` (a leftover ``X.partial`` or ``X.previous``) is mtft's to delete: a folder holding
    :data:`STAMP` or a JSON marker that names its kind, or an empty folder (nothing to lose)."""
    folder = Path(folder)
    if folder.is_symlink() or not folder.is_dir():
        return False
    return (folder / STAMP).is_file() or "kind" in marker(folder) or not any(folder.iterdir())


def recover(final: Path) -> None:
    """Undo an interrupted replacement: a complete ``final.previous`` that mtft wrote, without ``final``, becomes
    ``final`` again."""
    final = Path(final)
    previous = _sibling(final, "previous")
    if not final.exists() and is_complete(previous) and written_by_mtft(previous):
        os.replace(previous, final)


class AtomicFolder:
    """Write ``final`` completely or not at all: :meth:`begin`, write into the returned folder, :meth:`commit`."""

    def __init__(self, final: Path, replace: bool = True):
        self.final = Path(final)
        self.replace = replace  # False: commit never replaces a folder that is not empty (a user's output)
        self.partial = _sibling(self.final, "partial")
        self.previous = _sibling(self.final, "previous")

    def check(self) -> None:
        """Refuse (one CheckpointError) to write ``final`` while ``final.partial`` or ``final.previous`` exists and
        was not written by mtft: both would be deleted. Cheap; callers run it before heavy work too."""
        for leftover in (self.partial, self.previous):
            if (leftover.exists() or leftover.is_symlink()) and not written_by_mtft(leftover):
                raise CheckpointError(f"{leftover} exists and was not written by mtft; move it away")

    def begin(self, **description: Any) -> Path:
        """A fresh ``final.partial`` holding only the stamp (``description`` goes into it); a leftover of an
        interrupted attempt is removed, anything else refused (:meth:`check`)."""
        self.check()
        shutil.rmtree(self.partial, ignore_errors=True)
        try:
            self.partial.mkdir(parents=True)
            _write_synced(self.partial / STAMP, json.dumps({"writer": "mtft", **description}, sort_keys=True) + "\n")
        except OSError as exc:
            self.abort()
            raise_if_disk_full(exc, self.final)
            raise
        return self.partial

    def commit(self, **description: Any) -> Path:
        """Mark the partial folder complete (``description`` goes into the marker), flush it, and rename it to
        ``final``, replacing a previous ``final``. The stamp goes once the marker is there (a kill in between
        leaves a partial folder with the marker, still recognised as mtft's)."""
        try:
            _write_synced(self.partial / MARKER, json.dumps(description, sort_keys=True) + "\n")
            (self.partial / STAMP).unlink(missing_ok=True)
            _sync_tree(self.partial)
        except OSError as exc:
            self.abort()
            raise_if_disk_full(exc, self.final)
            raise
        if not self.replace:
            self._create()
            return self.final
        recover(self.final)
        previous = self.previous
        replacing = self.final.exists()
        if replacing:
            if previous.exists() or previous.is_symlink():
                if not written_by_mtft(previous):  # appeared since begin(): refuse rather than delete it
                    self.abort()
                    raise CheckpointError(f"{previous} exists and was not written by mtft; move it away")
                shutil.rmtree(previous)
            os.replace(self.final, previous)
        os.replace(self.partial, self.final)
        _sync_dir(self.final.parent)
        if replacing:
            shutil.rmtree(previous, ignore_errors=True)
        return self.final

    def _create(self) -> None:
        """``rename`` onto a missing or empty ``final`` only: a folder that filled meanwhile is kept, the partial
        one removed, and one line says so."""
        try:
            os.replace(self.partial, self.final)
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                raise
            self.abort()
            raise CheckpointError(f"{self.final} appeared while it was being written; it was left as it is") from None
        _sync_dir(self.final.parent)

    def abort(self) -> None:
        shutil.rmtree(self.partial, ignore_errors=True)

    @contextlib.contextmanager
    def writing(self, **description: Any) -> Iterator[Path]:
        """One process: ``with AtomicFolder(x).writing(kind="best") as folder: ...`` commits on success and
        removes the partial folder on an exception (a refused :meth:`begin` removes nothing)."""
        folder = self.begin(**description)
        try:
            yield folder
        except BaseException as exc:
            self.abort()
            raise_if_disk_full(exc, self.final)
            raise
        self.commit(**description)


def raise_if_disk_full(exc: BaseException, path: Path) -> None:
    """Turn a write that ran out of space (``OSError`` ENOSPC, or torch's ``RuntimeError`` around one) into one
    :class:`DiskFullError` line naming ``path``; any other exception is left to the caller to re-raise."""
    if (isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)) or (
        isinstance(exc, RuntimeError) and "No space left" in str(exc)
    ):
        raise DiskFullError(
            f"no space left on {path}; nothing of it was kept (free some space, then --resume)"
        ) from None


def write_json(path: Path, data: Any) -> None:
    """A JSON file replaced in one rename (readers never see half of it), flushed before the rename."""
    write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def write_text(path: Path, text: str) -> None:
    """A text file replaced in one rename (readers never see half of it), flushed before the rename."""
    path = Path(path)
    fd, tmp = private_temporary(path)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def private_temporary(path: Path) -> tuple[int, str]:
    """(descriptor, name) of a new file beside ``path`` to be renamed onto it: an unpredictable name created
    exclusively (``mkstemp``), so a link planted at a temporary name is never written through; its mode is what
    the umask gives a new file (``mkstemp`` makes it private, which the final file should not be)."""
    fd, tmp = tempfile.mkstemp(dir=Path(path).parent, prefix=f".{Path(path).name}.", suffix=".tmp")
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)
    return fd, tmp


def _sibling(path: Path, suffix: str) -> Path:
    return path.with_name(f"{path.name}.{suffix}")


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def _sync_tree(root: Path) -> None:
    """fsync every file and folder under ``root`` (files other writers, e.g. safetensors or DeepSpeed, closed)."""
    for folder, _, files in os.walk(root):
        for name in files:
            _sync_file(Path(folder) / name)
        _sync_dir(Path(folder))


def _sync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_dir(path: Optional[Path]) -> None:
    if path is None or os.name == "nt":  # directories cannot be opened for fsync on Windows
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
