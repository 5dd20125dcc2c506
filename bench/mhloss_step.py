"""Step time of MHLoss (Fu, So & Collier, 2023, eq. 10) with H heads against the plain one-head step.

    python bench/mhloss_step.py                                  # H = 50 vs 1, tiny e2e-sized encoder
    python bench/mhloss_step.py --hidden 384 --layers 12 --batch 32 --length 128 --kind multiple_choice

One process, one batch, two models that differ only in the head (the same encoder weights; the MHLoss model is the
plain one with ``out_proj`` turned into H heads by ``PooledHead.use_heads``). A step is forward, backward and an
AdamW update (plain PyTorch: a DeepSpeed engine adds the same work to both). The two kinds of step alternate, after
warm-up steps, so that load on the machine hits both alike; prints the median step times and their ratio.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from transformers import AutoModel, XLMRobertaConfig  # noqa: E402

from mtft.models.heads import PooledHead  # noqa: E402
from mtft.models.multitask import MultiTaskModel  # noqa: E402
from mtft.tasks.kinds import build_head  # noqa: E402

LABELS = {"sequence_classification": ["a", "b", "c"], "regression": ["score"], "multiple_choice": ["c1", "c2"]}


def build(args: argparse.Namespace) -> MultiTaskModel:
    torch.manual_seed(0)
    config = XLMRobertaConfig(
        vocab_size=8000,
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=max(1, args.hidden // 64),
        intermediate_size=4 * args.hidden,
        max_position_embeddings=args.length + 2,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
    )
    encoder = AutoModel.from_config(config, add_pooling_layer=False)
    head = build_head(args.kind, args.hidden, LABELS[args.kind], 0.1)
    return MultiTaskModel(encoder, {"task": head}, 1)


def make_batch(args: argparse.Namespace) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    rows = args.batch
    ids = torch.randint(5, 8000, (rows, args.length), generator=g)
    if args.kind == "sequence_classification":
        labels = torch.randint(0, 3, (rows,), generator=g).double()
    elif args.kind == "regression":
        labels = torch.rand(rows, generator=g, dtype=torch.float64) * 5
    else:
        labels = torch.randint(0, 2, (rows // 2,), generator=g).repeat_interleave(2).double()
    batch = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "labels": labels,
        "head_index": torch.zeros(rows, dtype=torch.long),
        "objective_index": torch.zeros(rows, dtype=torch.long),
    }
    if args.kind == "multiple_choice":  # examples of two choices
        batch["group_index"] = torch.arange(rows) // 2
    return batch


def step(model: MultiTaskModel, optimizer: torch.optim.Optimizer, batch: dict[str, torch.Tensor]) -> float:
    start = time.perf_counter()
    sums, counts = model(**batch)
    (sums.sum() / counts.sum()).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heads", type=int, default=50)
    parser.add_argument("--kind", choices=sorted(LABELS), default="sequence_classification")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--steps", type=int, default=30, help="measured steps of each kind")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", 1)))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    plain = build(args)
    multi = copy.deepcopy(plain)
    head = multi.heads["task"]
    assert isinstance(head, PooledHead)
    head.use_heads(args.heads)
    models = {"H=1": plain, f"H={args.heads}": multi}
    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=1e-5) for name, m in models.items()}
    batch = make_batch(args)
    times: dict[str, list[float]] = {name: [] for name in models}
    for repeat in range(args.warmup + args.steps):
        order = list(models) if repeat % 2 == 0 else list(reversed(models))  # interleaved, alternating first
        for name in order:
            took = step(models[name], optimizers[name], batch)
            if repeat >= args.warmup:
                times[name].append(took)
    medians = {name: statistics.median(t) for name, t in times.items()}
    (one, many) = medians.values()
    print(
        f"kind={args.kind} hidden={args.hidden} layers={args.layers} batch={args.batch} length={args.length} "
        f"threads={args.threads} steps={args.steps}"
    )
    for name, value in medians.items():
        print(f"{name:>6}: median step {value * 1e3:8.2f} ms")
    print(f"ratio H={args.heads} / H=1: {many / one:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
