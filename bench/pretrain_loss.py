"""Masked-LM pre-training's step: the model's own loss (logits at every position) against the loss from logits at
the masked positions only (:class:`mtft.training.pretrain.MaskedPositionsLM`, what pre-training uses).

    python bench/pretrain_loss.py                 # the demo's tiny encoder and XLM-R's vocabulary on a small encoder
    python bench/pretrain_loss.py --steps 9

Two shapes: the demo's (``configs/demo.yaml``: 2 layers of 64, a 2,000-piece vocabulary, 32 blocks of 32 tokens)
and a 4-layer, 256-wide encoder under XLM-R's 250,002-piece vocabulary (16 blocks of 64 tokens), where the
vocabulary-sized logits dominate. 15% of the tokens masked (``corpus.mlm_probability``). For each, a forward and
backward pass and an AdamW step of both losses, interleaved on the same weights: medians of ``--steps``; the peak
memory of a step above the resident set before it (sampled every ms). Also the two losses' difference at the start.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from lfmlf_step import peak_rss_during  # noqa: E402
from transformers import XLMRobertaConfig, XLMRobertaForMaskedLM  # noqa: E402

from mtft.core.labels import IGNORE_INDEX  # noqa: E402
from mtft.training.pretrain import MaskedPositionsLM  # noqa: E402

SHAPES = {
    "demo (64 wide, 2,000 pieces, 32 x 32)": (
        dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=2000),
        32,
        32,
    ),
    "256 wide, XLM-R's 250,002 pieces, 16 x 64": (
        dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024, vocab_size=250002),
        16,
        64,
    ),
}


def batch(vocab: int, rows: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, vocab, (rows, length), generator=g)
    labels = torch.where(torch.rand(rows, length, generator=g) < 0.15, input_ids, IGNORE_INDEX)
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": labels}


def one_step(loss_of, optimizer, b) -> None:
    optimizer.zero_grad(set_to_none=True)
    loss_of(b).backward()
    optimizer.step()


def measure(shape: dict, rows: int, length: int, steps: int) -> tuple[dict, dict, float]:
    """(median seconds a step, peak MiB above the resident set) of each loss, and their difference at the start."""
    mlm = XLMRobertaForMaskedLM(XLMRobertaConfig(**shape, max_position_embeddings=length + 2, type_vocab_size=1))
    masked = MaskedPositionsLM(mlm)
    optimizer = torch.optim.AdamW(mlm.parameters(), lr=1e-4)
    probe = batch(shape["vocab_size"], rows, length, seed=1)
    with torch.no_grad():
        mlm.eval()  # no dropout: the same function
        delta = abs(float(mlm(**probe).loss) - float(masked(**probe)))
        mlm.train()
    losses = {"own": lambda b: mlm(**b).loss, "masked": lambda b: masked(**b)}
    times: dict[str, list[float]] = {k: [] for k in losses}
    peaks: dict[str, float] = {}
    for step in range(steps + 1):  # step 0 of each is a warm-up, step 1 also samples the memory
        for kind, loss_of in losses.items():
            b = batch(shape["vocab_size"], rows, length, seed=step)
            start = time.perf_counter()
            if step == 1:
                base, top = peak_rss_during(lambda: one_step(loss_of, optimizer, b))  # noqa: B023 (called here)
                peaks[kind] = top - base
            else:
                one_step(loss_of, optimizer, b)
            if step:
                times[kind].append(time.perf_counter() - start)
    return {k: statistics.median(v) for k, v in times.items()}, peaks, delta


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=7)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(
        "| shape | own loss (ms/step) | masked positions (ms/step) | own ÷ masked | peak above resident, own "
        "(MiB) | masked (MiB) | loss difference |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, (shape, rows, length) in SHAPES.items():
        seconds, peaks, delta = measure(shape, rows, length, args.steps)
        own, ours = seconds["own"] * 1000, seconds["masked"] * 1000
        print(
            f"| {name} | {own:.0f} | {ours:.0f} | {own / ours:.2f}× | {peaks['own']:.0f} | {peaks['masked']:.0f} "
            f"| {delta:.1e} |"
        )


if __name__ == "__main__":
    main()
