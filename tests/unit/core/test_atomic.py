"""The one way mtft writes a folder: complete (marker, one rename) or invisible, replacements recoverable."""

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from mtft.core.atomic import MARKER, STAMP, AtomicFolder, is_complete, marker, recover, write_json
from mtft.core.errors import CheckpointError
from tests.helpers.launch import REPO, clean_env


def test_folder_appears_only_when_committed(tmp_path):
    final = tmp_path / "ckpt"
    folder = AtomicFolder(final)
    partial = folder.begin()
    (partial / "weights.bin").write_bytes(b"123")
    assert not final.exists() and not is_complete(partial)
    assert folder.commit(kind="checkpoint", step=3) == final
    assert not partial.exists() and (final / "weights.bin").read_bytes() == b"123"
    assert is_complete(final) and marker(final) == {"kind": "checkpoint", "step": 3}


def test_an_exception_leaves_nothing_and_keeps_the_previous_folder(tmp_path):
    final = tmp_path / "best"
    with AtomicFolder(final).writing(kind="best") as folder:
        (folder / "v").write_text("1")
    with pytest.raises(RuntimeError):
        with AtomicFolder(final).writing(kind="best") as folder:
            (folder / "v").write_text("2")
            raise RuntimeError("disk full")
    assert (final / "v").read_text() == "1" and not (tmp_path / "best.partial").exists()


def test_replacement_interrupted_between_the_renames_is_recovered(tmp_path):
    final = tmp_path / "best"
    with AtomicFolder(final).writing(kind="best") as folder:
        (folder / "v").write_text("old")
    os.replace(final, tmp_path / "best.previous")  # a kill right after the first rename of a replacement
    recover(final)
    assert (final / "v").read_text() == "old" and not (tmp_path / "best.previous").exists()
    folder = AtomicFolder(final)
    (folder.begin() / "v").write_text("new")
    os.replace(final, tmp_path / "best.previous")
    folder.commit(kind="best")  # the next writer recovers first, then replaces
    assert (final / "v").read_text() == "new" and not (tmp_path / "best.previous").exists()


def test_only_mtfts_own_leftover_partial_folder_is_replaced(tmp_path):
    """A leftover is removed only when it holds the stamp or the marker (or nothing); a folder of the user's that
    happens to be called x.partial is refused and kept, byte for byte."""
    folder = AtomicFolder(tmp_path / "x")
    leftover = folder.partial
    leftover.mkdir()
    (leftover / "precious.txt").write_text("mine")
    for attempt in (folder.begin, folder.check, lambda: folder.writing(kind="best").__enter__()):
        with pytest.raises(CheckpointError, match=rf"^{leftover} exists and was not written by mtft; move it away$"):
            attempt()
        assert sorted(p.name for p in leftover.iterdir()) == ["precious.txt"]
    assert (leftover / "precious.txt").read_text() == "mine" and not folder.final.exists()
    (leftover / "precious.txt").unlink()  # an empty folder holds nothing to lose
    assert [p.name for p in folder.begin().iterdir()] == [STAMP]


def test_a_foreign_previous_folder_is_neither_deleted_nor_recovered(tmp_path):
    final = tmp_path / "best"
    with AtomicFolder(final).writing(kind="best") as folder:
        (folder / "v").write_text("1")
    previous = tmp_path / "best.previous"
    previous.mkdir()
    (previous / "COMPLETE").write_text("my own marker file\n")  # complete-looking, but not mtft's JSON marker
    with pytest.raises(CheckpointError, match="best.previous exists and was not written by mtft"):
        AtomicFolder(final).begin()
    shutil.rmtree(final)
    recover(final)  # a foreign folder is never renamed into place
    assert not final.exists() and (previous / "COMPLETE").read_text() == "my own marker file\n"


KILLED_WRITER = """
import os, signal, sys
from pathlib import Path
from mtft.core.atomic import AtomicFolder
folder = AtomicFolder(Path(sys.argv[1]))
if sys.argv[2] == "writing":
    (folder.begin(kind="checkpoint", step=3) / "weights.bin").write_bytes(b"half")
else:  # killed after the marker was written, before the rename
    (folder.begin(kind="checkpoint") / "weights.bin").write_bytes(b"all")
    import mtft.core.atomic as atomic
    atomic._sync_tree = lambda root: os.kill(os.getpid(), signal.SIGKILL)
    folder.commit(kind="checkpoint")
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("moment", ["writing", "committing"])
def test_mtfts_own_leftover_of_a_killed_writer_is_cleaned_up(tmp_path, moment):
    final = tmp_path / "step-3"
    killed = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(final), moment], cwd=REPO, env=clean_env())
    assert killed.returncode == -signal.SIGKILL
    leftover = tmp_path / "step-3.partial"
    names = sorted(p.name for p in leftover.iterdir())
    assert names == ([STAMP, "weights.bin"] if moment == "writing" else [MARKER, "weights.bin"])
    assert not final.exists()
    folder = AtomicFolder(final)
    (folder.begin(kind="checkpoint", step=3) / "weights.bin").write_bytes(b"new")
    folder.commit(kind="checkpoint", step=3)
    assert sorted(p.name for p in final.iterdir()) == [MARKER, "weights.bin"]  # the stamp never reaches the folder
    assert (final / "weights.bin").read_bytes() == b"new" and not leftover.exists()


def test_write_json_replaces_in_one_rename(tmp_path):
    path = tmp_path / "state.json"
    write_json(path, {"step": 1})
    write_json(path, {"step": 2, "name": "é"})
    assert json.loads(path.read_text(encoding="utf-8")) == {"step": 2, "name": "é"}
    assert not (tmp_path / "state.json.tmp").exists()


def test_disk_full_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    import errno

    from mtft.core import atomic
    from mtft.core.errors import DiskFullError

    final = tmp_path / "best"
    with pytest.raises(DiskFullError, match=f"^no space left on {final}; "):
        with AtomicFolder(final).writing(kind="best") as folder:
            raise OSError(errno.ENOSPC, "No space left on device")
    assert list(tmp_path.iterdir()) == []

    def full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device")

    folder = AtomicFolder(final)
    (folder.begin() / "v").write_text("1")
    monkeypatch.setattr(atomic, "_write_synced", full)  # the marker itself does not fit
    with pytest.raises(DiskFullError):
        folder.commit(kind="best")
    assert list(tmp_path.iterdir()) == []
