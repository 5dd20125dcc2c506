"""The code fingerprint a study run records: it follows the source, file by file."""

from __future__ import annotations

from mtft.core import version


def test_fingerprint_changes_with_any_source_file_and_only_then(tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "sub" / "b.py").write_text("y = 2\n")
    (tmp_path / "notes.txt").write_text("not code\n")
    monkeypatch.setattr(version, "_PACKAGE", tmp_path)
    first = version.source_fingerprint()
    assert len(first) == 12 and version.source_fingerprint() == first
    (tmp_path / "notes.txt").write_text("still not code\n")
    assert version.source_fingerprint() == first
    (tmp_path / "sub" / "b.py").write_text("y = 3\n")
    changed = version.source_fingerprint()
    assert changed != first
    (tmp_path / "sub" / "b.py").rename(tmp_path / "b.py")  # same bytes, another module: another program
    assert version.source_fingerprint() != changed


def test_code_version_of_this_checkout():
    code = version.code_version()
    assert code["source"] == version.source_fingerprint()
    assert code["commit"] is None or len(code["commit"]) == 12
