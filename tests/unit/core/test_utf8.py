"""The streaming UTF-8 check of data files: it finds the first bad byte, and its line, where Python's own decoder
does, whatever the chunk size (a character cut by a chunk boundary is not a bad byte)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtft.core import utf8
from mtft.core.utf8 import utf8_error

NEWLINE = b"\n"


def expected(data: bytes):
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"byte {exc.start}, line {data.count(NEWLINE, 0, exc.start) + 1}"
    return None


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=60),
    junk=st.sampled_from([b"", b"\xff", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\x80abc", b"\xf4\x90\x80\x80"]),
    cut=st.integers(min_value=0, max_value=60),
    chunk=st.integers(min_value=1, max_value=9),
)
def test_agrees_with_pythons_decoder_at_every_chunk_size(tmp_path_factory, text, junk, cut, chunk):
    valid = text.replace("\r", "\n").encode("utf-8")
    data = valid[:cut] + junk + valid[cut:]  # junk may land inside a character: still Python's verdict
    path = tmp_path_factory.mktemp("u") / "f.jsonl"
    path.write_bytes(data)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(utf8, "CHUNK", chunk)
        assert utf8_error(path) == expected(data)


def test_position_names_byte_and_line(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_bytes(b'{"text": "ok"}\n{"text": "caf\xc3\xa9"}\n{"text": "bad \xff"}\n')
    assert utf8_error(path) == "byte 47, line 3"
    path.write_bytes("é".encode() * 3 + b"\xc3")  # ends inside a character
    assert utf8_error(path) == "byte 6, line 1"
    path.write_bytes(b"")
    assert utf8_error(path) is None
