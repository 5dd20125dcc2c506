"""The output-path policy (mtft.core.output), table-driven: each hostile or clumsy output is refused in one line
before anything is written, nothing of the user's is touched, and a write lands whole at the name given or not
at all (never through a link, never over an input, never inside a run, never over a second writer's)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from mtft.core.errors import CheckpointError
from mtft.core.output import OutputPolicy


def layout(tmp: Path) -> dict[str, Path]:
    """A user's folder: an input file, another file, a run folder, a folder of theirs."""
    (tmp / "run/checkpoints/step-1").mkdir(parents=True)
    (tmp / "run/config.yaml").write_text("run: {}\n")
    (tmp / "in.jsonl").write_text('{"text": "input"}\n')
    (tmp / "other.txt").write_text("the user's other file\n")
    (tmp / "mine").mkdir()
    (tmp / "mine/keep.txt").write_text("keep\n")
    (tmp / "empty").mkdir()
    (tmp / "space dir ü").mkdir()
    return {"run": tmp / "run", "input": tmp / "in.jsonl"}


def plant(tmp: Path, case: str) -> None:
    """What a case adds to the layout before the write."""
    if case == "symlink-at-out":
        (tmp / "out.jsonl").symlink_to(tmp / "other.txt")
    elif case == "symlink-at-lock":
        (tmp / ".out.jsonl.lock").symlink_to(tmp / "other.txt")
    elif case == "symlink-dir-into-run":
        (tmp / "link").symlink_to(tmp / "run")
    elif case == "hard-link-of-input":
        os.link(tmp / "in.jsonl", tmp / "same.jsonl")
    elif case == "symlink-at-out-folder":
        (tmp / "outdir").symlink_to(tmp / "mine")
    elif case == "user-partial-beside-folder":
        (tmp / "outdir.partial").mkdir()
        (tmp / "outdir.partial/precious.txt").write_text("mine\n")


# case: (kind, the output relative to tmp, what the one refusal line holds; None: the write succeeds)
CASES = {
    "new-file": ("file", "out.jsonl", None),
    "space-and-unicode": ("file", "space dir ü/out ü.jsonl", None),
    "symlink-at-out": ("file", "out.jsonl", "is a symbolic link"),
    "symlink-at-lock": ("file", "out.jsonl", "is a symbolic link; move it away"),
    "output-is-input": ("file", "in.jsonl", "is an input of this command"),
    "output-is-input-spelled-otherwise": ("file", "mine/../in.jsonl", "is an input of this command"),
    "hard-link-of-input": ("file", "same.jsonl", "is an input of this command"),
    "inside-run": ("file", "run/predictions.jsonl", "is inside the run folder"),
    "inside-run-checkpoint": ("file", "run/checkpoints/step-1/x.jsonl", "is inside the run folder"),
    "symlink-dir-into-run": ("file", "link/p.jsonl", "is inside the run folder"),
    "existing-file": ("file", "other.txt", "exists; choose another name"),
    "file-is-a-folder": ("file", "mine", "is a folder"),
    "no-such-folder": ("file", "nowhere/out.jsonl", "no folder"),
    "new-folder": ("folder", "outdir", None),
    "empty-folder": ("folder", "empty", None),
    "folder-of-the-user": ("folder", "mine", "exists and is not empty"),
    "folder-is-a-file": ("folder", "other.txt", "exists and is not empty"),
    "symlink-at-out-folder": ("folder", "outdir", "is a symbolic link"),
    "folder-inside-run": ("folder", "run/evaluation", "is inside the run folder"),
    "folder-is-the-run": ("folder", "run", "is an input of this command"),
    "user-partial-beside-folder": ("folder", "outdir", "outdir.partial exists and was not written by mtft"),
}


def snapshot(tmp: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(tmp)): (b"->" + os.readlink(p).encode()) if p.is_symlink() else p.read_bytes()
        for p in tmp.rglob("*")
        if p.is_file() or p.is_symlink()
    }


@pytest.mark.parametrize("case", sorted(CASES))
def test_output_policy(case, tmp_path):
    kind, name, refusal = CASES[case]
    given = layout(tmp_path)
    plant(tmp_path, case)
    policy = OutputPolicy("--out", inputs=[given["input"], given["run"]], runs=[given["run"]])
    before = snapshot(tmp_path)
    out = tmp_path / name
    writing = policy.writing_file(out) if kind == "file" else policy.writing_folder(out, kind="test")
    if refusal is None:
        with writing as target:
            if kind == "file":
                target.write("written\n")
            else:
                (target / "result.txt").write_text("written\n")
        written = out if kind == "file" else out / "result.txt"
        assert written.read_text() == "written\n"
        after = snapshot(tmp_path)
        new = set(after) - set(before)
        expected = {str(written.relative_to(tmp_path))} | (
            {str((out / "COMPLETE").relative_to(tmp_path))} if kind == "folder" else set()
        )
        assert new == expected, f"{case}: wrote {new}"
        assert {k: v for k, v in after.items() if k in before} == before
        return
    with pytest.raises(CheckpointError) as raised:
        with writing:
            raise AssertionError(f"{case}: the write was not refused")
    message = str(raised.value)
    assert refusal in message and "\n" not in message and message.startswith("--out"), message
    assert snapshot(tmp_path) == before, f"{case}: something was written or changed"


def test_a_failed_write_leaves_nothing(tmp_path):
    policy = OutputPolicy()
    for kind in ("file", "folder"):
        out = tmp_path / kind
        with pytest.raises(RuntimeError, match="half way"):
            with policy.writing_file(out) if kind == "file" else policy.writing_folder(out) as target:
                if kind == "file":
                    target.write("half")
                raise RuntimeError("half way")
    assert list(tmp_path.iterdir()) == []


def test_overwrite_replaces_a_file_but_never_through_a_link(tmp_path):
    policy = OutputPolicy()
    (tmp_path / "out.jsonl").write_text("old\n")
    with policy.writing_file(tmp_path / "out.jsonl", overwrite=True) as handle:
        handle.write("new\n")
    assert (tmp_path / "out.jsonl").read_text() == "new\n"
    (tmp_path / "other.txt").write_text("other\n")
    (tmp_path / "link.jsonl").symlink_to(tmp_path / "other.txt")
    with pytest.raises(CheckpointError, match="symbolic link"):
        with policy.writing_file(tmp_path / "link.jsonl", overwrite=True):
            pass
    assert (tmp_path / "other.txt").read_text() == "other\n"


def slow_writer(policy, kind, out, inside, release, errors) -> None:
    """The first writer: holds ``out`` until ``release`` is set."""
    try:
        with policy.writing_file(out) if kind == "file" else policy.writing_folder(out) as target:
            inside.set()
            release.wait(10)
            if kind == "file":
                target.write("first\n")
    except Exception as exc:  # noqa: BLE001 -- reported by the test
        errors.append(exc)


def test_a_second_writer_is_refused_and_the_first_is_kept(tmp_path):
    """Two commands into one output at once: the second is refused while the first writes; a file that appears
    at the name from elsewhere while the first writes is kept, and the first refused."""
    policy = OutputPolicy()
    for kind in ("file", "folder"):
        out = tmp_path / f"out-{kind}"
        inside, release = threading.Event(), threading.Event()
        errors: list = []
        thread = threading.Thread(target=slow_writer, args=(policy, kind, out, inside, release, errors))
        thread.start()
        assert inside.wait(10)
        with pytest.raises(CheckpointError, match="is being written by another mtft command"):
            with policy.writing_file(out) if kind == "file" else policy.writing_folder(out):
                pass
        release.set()
        thread.join(10)
        assert not errors, errors
        assert out.exists()
    # a file put at the name by someone else while mtft writes: kept, the write refused
    out = tmp_path / "raced.jsonl"
    with pytest.raises(CheckpointError, match="appeared while this command was writing it"):
        with policy.writing_file(out) as handle:
            handle.write("mtft\n")
            out.write_text("someone else's\n")
    assert out.read_text() == "someone else's\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out-file", "out-folder", "raced.jsonl"]


def test_a_folder_filled_meanwhile_is_kept(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(CheckpointError, match="appeared while it was being written"):
        with OutputPolicy().writing_folder(out) as partial:
            (partial / "result.txt").write_text("mtft\n")
            out.mkdir()
            (out / "theirs.txt").write_text("theirs\n")
    assert [p.name for p in out.iterdir()] == ["theirs.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_the_file_gets_the_umask_mode_not_the_temporarys(tmp_path):
    with OutputPolicy().writing_file(tmp_path / "out.jsonl") as handle:
        handle.write("x\n")
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "out.jsonl").stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_killed_writers_temporary_is_removed_by_the_next_write(tmp_path):
    """kill -9 while writing leaves a private temporary (and the lock file, which holds no lock): the rerun writes
    the file and removes the leftover; a file of the user's of another shape is left alone."""
    leftover = tmp_path / ".out.jsonl.ab12cd_9.tmp"
    leftover.write_text("half")
    (tmp_path / ".out.jsonl.lock").write_text("")
    mine = tmp_path / ".out.jsonl.mine.tmp"
    mine.write_text("the user's\n")
    with OutputPolicy().writing_file(tmp_path / "out.jsonl") as handle:
        handle.write("whole\n")
    assert (tmp_path / "out.jsonl").read_text() == "whole\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.jsonl.mine.tmp", "out.jsonl"]


def test_a_folder_output_under_missing_folders_makes_them_and_a_failed_one_removes_them(tmp_path):
    """`evaluate --out evals/sw` where evals/ does not exist yet: the folders are made (the lock file lives beside
    the output); a command that fails leaves none of them behind."""
    policy = OutputPolicy()
    with policy.writing_folder(tmp_path / "evals" / "sw", kind="test") as partial:
        (partial / "metrics.json").write_text("{}")
    assert (tmp_path / "evals" / "sw" / "metrics.json").read_text() == "{}"
    with pytest.raises(RuntimeError, match="stopped"):
        with policy.writing_folder(tmp_path / "a" / "b" / "c", kind="test"):
            raise RuntimeError("stopped")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["evals"]
