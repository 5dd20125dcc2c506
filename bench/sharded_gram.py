"""Per-rank buffer memory and bytes communicated per step: the sharded per-objective gradients against the
unsharded path, and the LF-MLF step against the plain mean-loss step, for T objectives and N gloo processes.

    python bench/sharded_gram.py                  # T = 2, 15, 48; N = 1, 2; prints Markdown tables
    python bench/sharded_gram.py --layers 2 --objectives 15
    python bench/sharded_gram.py --precision      # bfloat16 buffers against float32 ones: the Gram's error

Every (N, T) point runs one step of each kind on the same global batch, from the same random weights (no
download), in N processes (torch.multiprocessing, gloo):
  plain      the mean of the per-objective losses, one backward          (mtft.training.step.LossWeightedStep)
  unsharded  LF-MLF, the per-objective gradients all-reduced whole        (gradient_store, shard=False)
  sharded    LF-MLF, reduce-scatter / partial Gram / each rank its part of the combination, completed by the
             engine's gradient averaging (the default on N > 1; mtft/gradients/sharded.py)
The engine is a minimal data-parallel one standing in for DeepSpeed ZeRO-0 (backward, one all-reduce of the
gradient, AdamW), so that every collective goes through torch.distributed, where this script counts it. Bytes
communicated are those a rank sends in the bandwidth-optimal (ring) algorithm: 2(N−1)/N · n for an all-reduce of
n bytes, (N−1)/N · n for a reduce-scatter of n bytes in or an all-gather of n bytes out (zero on one process).
Buffer memory is what the step allocates for per-objective gradients, counted from the tensors: the unsharded
path's T × P accumulation buffer; the sharded path's T × P/N shard, the most layer staging buffers in flight at once
during the backward pass; and in both the row-sparse weights' buffers of the touched rows
(mtft/gradients/row_sparse.py; the word embeddings are frozen, as XLM-R's
dense-parameter count leaves them out: see freeze_word_embeddings). Each path's Gram is compared with the Gram of
the reduced gradients formed in float64 throughout, and the two paths' updated weights with each other. The same
formulas then give the table for XLM-R large at N = 8, checked against every measured point.

--precision instead compares, on one process and the same batch, the Gram, the LF-MLF weights and the combined
gradient from bfloat16 buffers (gradients.buffers: bfloat16; float32 accumulation) with float32 ones.

Shapes: XLM-R base (hidden 768, 12 heads, FFN 3072) with --layers of its 12 layers (1 by default, so that T = 48
buffers of two processes fit this 23 GB machine) and an 8000-row vocabulary (250002 in XLM-R: T copies of its
embedding would not fit); the ratios depend on P only through P's size against T² and the vocabulary.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from lfmlf_step import build, make_batch  # noqa: E402
from transformers import AutoModel, XLMRobertaConfig  # noqa: E402

from mtft.gradients.store import ShardedStore  # noqa: E402
from mtft.training.gradient_store import gradient_store  # noqa: E402
from mtft.training.gram_step import GramWeightedStep  # noqa: E402
from mtft.training.step import LossWeightedStep  # noqa: E402
from mtft.weighting import MeanWeighting, build_weighting  # noqa: E402

FLOAT32, FLOAT64 = 4, 8
COUNTED = (
    "all_reduce",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "all_gather_single",
    "all_gather_into_tensor",
)


class DataParallelEngine:
    """What DeepSpeed ZeRO-0 does with a step's gradient, through torch.distributed: backward, all-reduce the
    gradient (one flat bucket) and average it, AdamW."""

    def __init__(self, module: torch.nn.Module, world_size: int):
        self.module, self.device, self.world_size = module, torch.device("cpu"), world_size
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=1e-5)

    def __call__(self, **batch):
        return self.module(**batch)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()
        if self.world_size > 1:
            flat = torch.cat([p.grad.reshape(-1) for p in self.params])
            torch.distributed.all_reduce(flat)
            flat /= self.world_size
            offset = 0
            for p in self.params:
                p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
                offset += p.numel()

    def step(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


class Traffic:
    """Counts the bytes every collective of torch.distributed sends per rank (ring algorithm)."""

    def __init__(self, world_size: int):
        self.world_size, self.bytes, self.calls = world_size, 0.0, 0
        self.originals = {
            name: getattr(torch.distributed, name) for name in COUNTED if hasattr(torch.distributed, name)
        }

    def __enter__(self) -> "Traffic":
        for name, fn in self.originals.items():
            setattr(torch.distributed, name, self._counting(name, fn))
        return self

    def __exit__(self, *exc) -> None:
        for name, fn in self.originals.items():
            setattr(torch.distributed, name, fn)

    def _counting(self, name: str, fn):
        def wrapper(*args, **kwargs):
            share = (self.world_size - 1) / self.world_size
            if name == "all_reduce":
                self.bytes += 2 * share * _nbytes(args[0])
            elif name.startswith("reduce_scatter"):
                self.bytes += share * _nbytes(args[1])  # the input, of which each rank keeps 1/N
            else:
                self.bytes += share * _nbytes(args[0])  # the gathered output
            self.calls += 1
            return fn(*args, **kwargs)

        return wrapper


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def dense_layers(model: torch.nn.Module) -> list[int]:
    """The trainable dense parameters of each Linear / LayerNorm layer: the units the sharded path reduces."""
    return [
        n
        for m in model.modules()
        if isinstance(m, (torch.nn.Linear, torch.nn.LayerNorm))
        and (n := sum(p.numel() for p in m.parameters(recurse=False) if p.requires_grad))
    ]


def predicted(kind: str, layers: list[int], T: int, N: int, sparse: dict[str, int]) -> dict[str, float]:
    """The same quantities from the formulas: dense layers of the given sizes and row-sparse weights of
    ``sparse["params"]`` parameters in ``sparse["rows"]`` rows, of which the step touches rows holding
    ``sparse["touched"]`` elements and whose buffers have room for ``sparse["capacity"]`` elements (their slots as
    allocated: at least the touched ones); float32 buffers, T objectives (all present), N ranks, one micro-batch."""
    share = (N - 1) / N
    D, S = sum(layers), sparse["params"]
    P = D + S
    step = 2 * share * P * FLOAT32  # the engine's gradient all-reduce
    losses = 2 * 2 * share * T * FLOAT64  # the sums and counts, all-reduced in float64
    if kind == "plain":
        return {"bytes": step + losses, "buffer": 0.0}
    masks = 2 * share * sparse["rows"] * FLOAT32 if N > 1 else 0.0  # the touched-row masks made their union
    sparse_reduce = 2 * share * T * sparse["touched"] * FLOAT32  # the touched rows of the row-sparse weights
    sparse_buffer = T * sparse["capacity"] * FLOAT32
    if kind == "unsharded" or N == 1:  # one process shards nothing
        dense_reduce = 2 * share * T * D * FLOAT32
        return {
            "bytes": step + losses + masks + dense_reduce + sparse_reduce,
            "buffer": T * D * FLOAT32 + sparse_buffer,
        }
    parts = [-(-n // N) for n in layers]  # each layer split in N equal parts (padded)
    agree = 2 * share * (T + len(layers)) * FLOAT64  # the objectives present and the layers that will fire
    scatter = share * T * N * sum(parts) * FLOAT32  # each layer's T rows reduce-scattered
    gram = 2 * share * T * T * FLOAT64
    # no all-gather of the combination: each rank hands the engine its part, which the step's reduction completes
    shard, staging = T * sum(parts) * FLOAT32, T * N * max(parts) * FLOAT32  # one layer's staging in flight
    return {
        "bytes": step + losses + masks + agree + scatter + sparse_reduce + gram,
        "buffer": shard + staging + sparse_buffer,
    }


def run_point(rank: int, world_size: int, port: int, args, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.set_num_threads(1)
    batch = make_batch(args.objectives, args.batch, args.length)
    mine = {k: v[rank::world_size] for k, v in batch.items()}  # this rank's share of the global batch
    out: dict[str, dict] = {}
    grams, weights = {}, {}
    for kind in ("plain", "unsharded", "sharded"):
        model = build(args.objectives, 768, args.layers)
        freeze_word_embeddings(model)
        engine = DataParallelEngine(model, world_size)
        if kind == "plain":
            step = LossWeightedStep(engine, MeanWeighting(), args.objectives, world_size)
        else:
            store = gradient_store(engine, args.objectives, world_size, engine.params, shard=kind == "sharded")
            step = GramWeightedStep(store, build_weighting("lfmlf"))
        with Traffic(world_size) as traffic:
            step([dict(mine)])
        buffer, touched, capacity = 0, 0, 0
        if kind != "plain":
            collector = step.store.collector
            buffer = _nbytes(collector.flat) + sum(b.nbytes for b in collector.sparse.values())
            touched = sum(len(collector.touched_rows(p)) * p[0].numel() for p in collector.embeddings)
            capacity = sum(b.store[0].numel() for b in collector.sparse.values())
            if isinstance(step.store, ShardedStore):
                sharded = step.store.sharded
                buffer += _nbytes(sharded.shard) + sharded.peak_staging_bytes
                grams[kind] = sharded.gram(engine.params)
            else:
                grams[kind] = collector.gram(engine.params)
                # the reduced gradients' Gram in float64 throughout, to tell each path's float32 round-off
                flat = collector.flat.double()
                grams["float64"] = flat @ flat.t()
                for p in collector.embeddings:
                    block = collector.sparse[p].block(collector.touched_rows(p)).reshape(len(flat), -1).double()
                    grams["float64"] += block @ block.t()
            weights[kind] = torch.cat([p.detach().reshape(-1) for p in engine.params])
            collector.detach()
        embeddings = [m.weight for m in model.modules() if isinstance(m, torch.nn.Embedding) and m.weight.requires_grad]
        sparse = {"params": sum(w.numel() for w in embeddings), "rows": sum(w.shape[0] for w in embeddings)}
        P = sum(p.numel() for p in engine.params)
        out[kind] = {
            "bytes": traffic.bytes,
            "calls": traffic.calls,
            "buffer": buffer,
            "P": P,
            "layers": dense_layers(model),
            "sparse": {**sparse, "touched": touched, "capacity": capacity},
        }
        del step, engine, model
    exact = grams["float64"]
    gram_error = {
        kind: ((grams[kind] - exact).abs().max() / exact.abs().max()).item() for kind in ("unsharded", "sharded")
    }
    weight_error = (weights["sharded"] - weights["unsharded"]).abs().max().item()
    if rank == 0:
        results.put({"points": out, "gram_rel_error": gram_error, "weight_abs_error": weight_error})
    torch.distributed.destroy_process_group()


def measure(args, world_size: int) -> dict:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    results = mp.get_context("spawn").SimpleQueue()
    mp.spawn(run_point, args=(world_size, port, args, results), nprocs=world_size, join=True)
    return results.get()


def freeze_word_embeddings(model: torch.nn.Module) -> None:
    """The word embeddings stay frozen here, as the dense-parameter count of XLM-R (≈ 86 M base, ≈ 300 M large)
    leaves them out: their per-objective buffer is T × vocabulary × hidden on every rank, sharded or not (only
    the rows a step touches are read, cleared and reduced)."""
    for name, p in model.named_parameters():
        if "word_embeddings" in name:
            p.requires_grad_(False)


def large_dense_layers() -> list[int]:
    """XLM-R large's encoder layers without its word embeddings (frozen), built on the meta device: no memory,
    no download."""
    config = XLMRobertaConfig(
        vocab_size=250002, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096
    )
    with torch.device("meta"):
        encoder = AutoModel.from_config(config, add_pooling_layer=False)
    freeze_word_embeddings(encoder)
    return dense_layers(encoder)


def precision(args) -> None:
    """bfloat16 against float32 buffers, one process, the same model and batch."""
    import numpy as np

    from mtft.gradients import PerObjectiveGradients

    print(
        "| T | Gram max rel. error | diagonal max rel. error | cosine max abs. error | LF-MLF weights max abs. diff "
        "| combined gradient rel. error |"
    )
    print("|" + "---:|" * 6)
    for t in args.objectives:
        model = build(t, 768, args.layers)
        batch = make_batch(t, args.batch, args.length)
        batch = {k: v[torch.argsort(batch["objective_index"], stable=True)] for k, v in batch.items()}
        results = {}
        for dtype in (torch.float32, torch.bfloat16):
            collector = PerObjectiveGradients(model, t, dtype=dtype).attach()
            detached = {name: p.detach() for name, p in model.named_parameters()}
            with collector.capturing():
                sums, counts = torch.func.functional_call(model, detached, args=(), kwargs=batch)
            sums.sum().backward()
            collector.finalize()
            scale = 1.0 / counts.double()
            gram = collector.gram(list(collector.names)) * scale[:, None] * scale[None, :]
            w = torch.as_tensor(build_weighting("lfmlf")(np.zeros(t), gram.numpy()))
            combined = torch.cat([v.reshape(-1).float() for v in collector.combine(w * scale).values()])
            results[dtype] = gram, w, combined
            collector.detach()
            del collector
        (g32, w32, c32), (g16, w16, c16) = results[torch.float32], results[torch.bfloat16]
        d32, d16 = g32.diagonal().sqrt(), g16.diagonal().sqrt()
        cos32, cos16 = g32 / (d32[:, None] * d32[None, :]), g16 / (d16[:, None] * d16[None, :])
        print(
            f"| {t} | {((g16 - g32).abs().max() / g32.abs().max()).item():.1e} | "
            f"{((g16.diagonal() - g32.diagonal()).abs() / g32.diagonal()).max().item():.1e} | "
            f"{(cos16 - cos32).abs().max().item():.1e} | {(w16 - w32).abs().max().item():.1e} | "
            f"{((c16 - c32).norm() / c32.norm()).item():.1e} |",
            flush=True,
        )


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.3f}" if b else "–"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objectives", type=int, nargs="*", default=[2, 15, 48])
    parser.add_argument("--ranks", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--batch", type=int, default=96)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--precision", action="store_true", help="bfloat16 against float32 buffers instead")
    args = parser.parse_args()
    if args.precision:
        return precision(args)
    print(
        f"model: XLM-R base shapes (hidden 768, FFN 3072), {args.layers} of 12 layers, vocab 8000; global batch "
        f"{args.batch} x {args.length} tokens; one step of each kind per point\n"
    )
    print(
        "| T | N | P | buffer MiB/rank unsharded | sharded | sharded ÷ unsharded | LF-MLF buffer ÷ plain gradient "
        "| MiB sent/rank plain | unsharded | sharded | sharded ÷ unsharded | LF-MLF (sharded) ÷ plain "
        "| Gram rel. error unsharded | sharded | weights abs. diff | formulas' worst rel. error |"
    )
    print("|" + "---:|" * 16)
    for t in args.objectives:
        for n in args.ranks:
            point = argparse.Namespace(**{**vars(args), "objectives": t})
            got = measure(point, n)
            pts = got["points"]
            P = pts["plain"]["P"]
            worst = max(
                abs(predicted(kind, pts[kind]["layers"], t, n, pts[kind]["sparse"])[key] - pts[kind][key])
                / max(pts[kind][key], 1.0)
                for kind in pts
                for key in ("bytes", "buffer")
            )
            mib = 2**20
            print(
                f"| {t} | {n} | {P / 1e6:.1f} M | {pts['unsharded']['buffer'] / mib:.0f} | "
                f"{pts['sharded']['buffer'] / mib:.0f} | "
                f"{_ratio(pts['sharded']['buffer'], pts['unsharded']['buffer'])} "
                f"| {pts['sharded']['buffer'] / (P * FLOAT32):.2f} | {pts['plain']['bytes'] / mib:.1f} | "
                f"{pts['unsharded']['bytes'] / mib:.1f} | {pts['sharded']['bytes'] / mib:.1f} | "
                f"{_ratio(pts['sharded']['bytes'], pts['unsharded']['bytes'])} | "
                f"{_ratio(pts['sharded']['bytes'], pts['plain']['bytes'])} | "
                f"{got['gram_rel_error']['unsharded']:.1e} | {got['gram_rel_error']['sharded']:.1e} | "
                f"{got['weight_abs_error']:.1e} | {worst:.1e} |",
                flush=True,
            )
    layers = large_dense_layers()
    gib, none = 2**30, {"params": 0, "rows": 0, "touched": 0, "capacity": 0}
    print(
        f"\nXLM-R large at N = 8 from the same formulas: P = {sum(layers) / 1e6:.0f} M dense (word embeddings frozen; "
        "the position embeddings' few touched rows left out)\n"
    )
    print(
        "| T | buffer GiB/rank unsharded | sharded | GiB sent/rank plain | unsharded | sharded | "
        "sharded ÷ unsharded | LF-MLF (sharded) ÷ plain |"
    )
    print("|" + "---:|" * 8)
    for t in args.objectives:
        plain, unsharded, sharded = (predicted(kind, layers, t, 8, none) for kind in ("plain", "unsharded", "sharded"))
        print(
            f"| {t} | {unsharded['buffer'] / gib:.1f} | {sharded['buffer'] / gib:.1f} | {plain['bytes'] / gib:.2f} "
            f"| {unsharded['bytes'] / gib:.1f} | {sharded['bytes'] / gib:.1f} | "
            f"{sharded['bytes'] / unsharded['bytes']:.3f} | {sharded['bytes'] / plain['bytes']:.1f} |"
        )


if __name__ == "__main__":
    main()
