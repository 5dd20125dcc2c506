"""Step time and peak memory of the LF-MLF step against the plain mean-loss step (same model, same batch).

    python bench/lfmlf_step.py                       # T = 2, 8, 15, 48; prints a Markdown table
    python bench/lfmlf_step.py --objectives 15 --steps 10

Three steps per T, measured side by side (interleaved, medians over --steps repetitions) in one process on one
DeepSpeed engine (ZeRO 0, AdamW):
  plain  the mean of the per-objective losses, one backward             (mtft.training.step.LossWeightedStep)
  lfmlf  per-objective gradients by hooks, Gram, exact min-norm solve, one surrogate backward (GramWeightedStep)
  naive  T separate torch.autograd.grad calls for the per-objective gradients, then the same Gram/solve/update
Peak memory is how far the resident set of a fresh process rises above its level before the steps while it
runs only one kind of step (sampled every millisecond; CPU has no allocator counter as a GPU has), reported as
a ratio to the plain step's. It includes what the steps keep between steps: the optimizer state (alike for
all kinds) and LF-MLF's per-objective gradient buffers, T × (trainable parameters) floats.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModel, XLMRobertaConfig  # noqa: E402

from mtft.models.heads import SequenceClassificationHead  # noqa: E402
from mtft.models.multitask import MultiTaskModel  # noqa: E402
from mtft.training.gram_step import GramWeightedStep  # noqa: E402
from mtft.training.step import LossWeightedStep, StepResult  # noqa: E402
from mtft.weighting import MeanWeighting, build_weighting  # noqa: E402


def build(num_objectives: int, hidden: int, layers: int, seed: int = 0):
    torch.manual_seed(seed)
    config = XLMRobertaConfig(
        vocab_size=8000,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64),
        intermediate_size=4 * hidden,
        max_position_embeddings=130,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    encoder = AutoModel.from_config(config, add_pooling_layer=False)
    head = SequenceClassificationHead(hidden, ["a", "b", "c"], 0.0)  # one task, T languages share its head
    return MultiTaskModel(encoder, {"nli": head}, num_objectives)


def make_batch(num_objectives: int, batch: int, length: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(length // 2, length + 1, (batch,), generator=g)
    ids = torch.randint(5, 8000, (batch, length), generator=g)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
    ids = torch.where(mask.bool(), ids, torch.ones_like(ids))  # padding id 1, as in XLM-R
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "labels": torch.randint(0, 3, (batch,), generator=g),
        "head_index": torch.zeros(batch, dtype=torch.long),
        "objective_index": torch.arange(batch) % num_objectives,
    }


class NaiveStep(GramWeightedStep):
    """Per-objective gradients by T separate autograd.grad calls (the reference), then the same update."""

    def __call__(self, micro_batches) -> StepResult:
        (batch,) = list(micro_batches)
        params = [p for p in self.module.parameters() if p.requires_grad]
        sums, counts = self.module(**batch)
        grads = []
        for t in range(self.num_objectives):
            g = torch.autograd.grad(
                sums[t] / counts[t], params, retain_graph=t < self.num_objectives - 1, allow_unused=True
            )
            grads.append(torch.cat([(torch.zeros_like(p) if x is None else x).reshape(-1) for x, p in zip(g, params)]))
        flat = torch.stack(grads)
        gram = (flat @ flat.t()).double().numpy()
        w = torch.as_tensor(self.weighting(np.zeros(self.num_objectives), gram))
        combined = w.to(flat.dtype) @ flat
        offset, surrogate = 0, 0.0
        for p in params:
            surrogate = surrogate + (p * combined[offset : offset + p.numel()].view_as(p)).sum()
            offset += p.numel()
        self.engine.backward(surrogate)
        self.engine.step()
        return StepResult(sums.detach(), counts.detach(), w, 0.0, batch["input_ids"].shape[0])


def engine_for(model, lr=1e-5):
    import deepspeed

    if not torch.distributed.is_initialized():
        os.environ.update(
            RANK="0",
            LOCAL_RANK="0",
            WORLD_SIZE="1",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=os.environ.get("MASTER_PORT", "29581"),
        )
        deepspeed.init_distributed(verbose=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 0},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return engine


def make_step(kind: str, engine, num_objectives: int):
    params = [p for p in engine.module.parameters() if p.requires_grad]
    if kind == "plain":
        return LossWeightedStep(engine, MeanWeighting(), num_objectives, 1)
    cls = GramWeightedStep if kind == "lfmlf" else NaiveStep
    return cls(engine, build_weighting("lfmlf"), num_objectives, 1, shared=params)


def time_steps(args) -> dict[str, float]:
    model = build(args.objectives, args.hidden, args.layers)
    engine = engine_for(model)
    batch = make_batch(args.objectives, args.batch, args.length)
    steps = {kind: make_step(kind, engine, args.objectives) for kind in ("plain", "lfmlf", "naive")}
    times: dict[str, list[float]] = {kind: [] for kind in steps}
    for repeat in range(args.steps + 1):
        for kind, step in steps.items():  # interleaved, so that machine noise hits every kind alike
            if kind == "naive" and repeat > args.naive_steps:
                continue  # T backward passes are slow; a few repetitions suffice for the comparison
            start = time.perf_counter()
            step([dict(batch)])
            if repeat:  # the first round warms up
                times[kind].append(time.perf_counter() - start)
    return {kind: statistics.median(v) for kind, v in times.items()}


def peak_memory(args, kind: str) -> float:
    """Resident-set growth (MiB) of a fresh process running ``kind`` steps."""
    command = [
        sys.executable,
        __file__,
        "--memory-of",
        kind,
        "--objectives",
        str(args.objectives),
        "--hidden",
        str(args.hidden),
        "--layers",
        str(args.layers),
        "--batch",
        str(args.batch),
        "--length",
        str(args.length),
        "--steps",
        "2",
    ]
    out = subprocess.run(
        command,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "MASTER_PORT": str(29600 + args.objectives)},
    )
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_growth_mib"]


def _rss_mib() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def memory_child(args) -> None:
    """Peak resident memory during the steps minus the resident memory just before the first one, sampled
    every ms (ru_maxrss is a lifetime high-water mark that start-up may already have set)."""
    model = build(args.objectives, args.hidden, args.layers)
    engine = engine_for(model)
    batch = make_batch(args.objectives, args.batch, args.length)
    step = make_step(args.memory_of, engine, args.objectives)
    peak, done = [0.0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss_mib())
            time.sleep(0.001)

    base = _rss_mib()
    sampler = threading.Thread(target=sample)
    sampler.start()
    for _ in range(args.steps):
        step([dict(batch)])
    done.set()
    sampler.join()
    print(json.dumps({"peak_growth_mib": peak[0] - base}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objectives", type=int, nargs="*", default=[2, 8, 15, 48])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=48)
    parser.add_argument("--length", type=int, default=96)
    parser.add_argument("--steps", type=int, default=9, help="timed steps of plain and LF-MLF")
    parser.add_argument("--naive-steps", type=int, default=2, help="timed steps of the naive method")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    parser.add_argument("--memory-of", choices=["plain", "lfmlf", "naive"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_of:
        args.objectives = args.objectives[0] if isinstance(args.objectives, list) else args.objectives
        return memory_child(args)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1)))
    print(
        f"model: XLM-R-style encoder, hidden {args.hidden}, {args.layers} layers, vocab 8000; batch "
        f"{args.batch} x {args.length} tokens (padded); medians of {args.steps} (naive: {args.naive_steps}) "
        f"interleaved timed steps; {torch.get_num_threads()} threads\n"
    )
    print(
        "| T | plain step (ms) | LF-MLF step (ms) | LF-MLF ÷ plain | naive T-backward ÷ plain | "
        "peak memory LF-MLF ÷ plain | naive ÷ plain |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for t in args.objectives:
        one = argparse.Namespace(**{**vars(args), "objectives": t})
        med = time_steps(one)
        if args.no_memory:
            mem = "–", "–"
        else:
            plain_mem = peak_memory(one, "plain")
            mem = tuple(f"{peak_memory(one, k) / plain_mem:.2f}×" for k in ("lfmlf", "naive"))
        print(
            f"| {t} | {med['plain'] * 1e3:.1f} | {med['lfmlf'] * 1e3:.1f} | {med['lfmlf'] / med['plain']:.3f}× | "
            f"{med['naive'] / med['plain']:.2f}× | {mem[0]} | {mem[1]} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
