"""Is a user's text file UTF-8? Checked by streaming it, for data files of any size.

Arrow's JSON reader (``datasets``' ``json`` builder) accepts a file with invalid UTF-8 bytes and fails only when a
row is read back, far from the file -- or never, for rows nobody reads. So a data file is decoded once, strictly,
before it is handed over: in 1 MiB chunks through an incremental decoder (a multi-byte character may straddle two
chunks), never the whole file in memory; a pure-ASCII chunk is skipped without decoding.
"""

from __future__ import annotations

import codecs
from pathlib import Path
from typing import Optional

CHUNK = 1 << 20


def utf8_error(path: str | Path) -> Optional[str]:
    """Where ``path`` stops being UTF-8 (``"byte 1234, line 7"``), or None when all of it is."""
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    offset = newlines = 0  # bytes and line breaks before the current chunk
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            pending = decoder.getstate()[0]  # the start of a character cut by the previous chunk
            if not pending and chunk.isascii():
                offset, newlines = offset + len(chunk), newlines + chunk.count(b"\n")
                continue
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as exc:  # exc.object is pending + chunk; pending holds no line break
                return position(offset - len(pending) + exc.start, newlines + exc.object[: exc.start].count(b"\n"))
            offset, newlines = offset + len(chunk), newlines + chunk.count(b"\n")
        pending = decoder.getstate()[0]
        if pending:  # the file ends inside a character
            return position(offset - len(pending), newlines)
    return None


def position(offset: int, newlines_before: int) -> str:
    return f"byte {offset}, line {newlines_before + 1}"
