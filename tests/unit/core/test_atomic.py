"""The one way mtft writes a folder: complete (marker, one rename) or invisible, replacements recoverable."""

import json
import os

import pytest

from mtft.core.atomic import MARKER, AtomicFolder, is_complete, marker, recover, write_json


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


def test_a_leftover_partial_folder_is_replaced(tmp_path):
    leftover = tmp_path / "x.partial"
    leftover.mkdir()
    (leftover / "stale").write_text("?")
    folder = AtomicFolder(tmp_path / "x")
    assert list(folder.begin().iterdir()) == []
    assert (folder.commit() / MARKER).is_file()


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
