"""Step time and peak memory of the Gram steps against the plain mean-loss step (same model, same batch).

    python bench/lfmlf_step.py                       # T = 2, 8, 15, 48, 100; prints Markdown tables
    python bench/lfmlf_step.py --objectives 15 48 --steps 10
    python bench/lfmlf_step.py --bytes               # the bytes table by formula only (XLM-R base and large)
    python bench/lfmlf_step.py --objectives 48 --checkpointing --kinds buffered bufferless bufferless_backward
    python bench/lfmlf_step.py --objectives 15 48 --traffic --no-memory   # with the buffered step's floor

Six steps per T, measured side by side (interleaved, medians over --steps repetitions) in one process on one
DeepSpeed engine (ZeRO 0, AdamW), every one ending in the engine's step:
  plain       the mean of the per-objective losses, one backward             (mtft.training.step.LossWeightedStep)
  buffered    per-objective gradients by hooks into T × P buffers, Gram, exact min-norm solve, one surrogate
              backward (GramWeightedStep; gradients.buffers: full)
  bufferless  the same step without the buffers: the Gram layer by layer from the backward pass's tape, the
              update from the row-scaled output gradients (gradients.buffers: none)
  bufferless_backward  the same without the tape: the Gram formed at each layer during the backward pass, the
              update by a second backward pass of the weighted losses (gradients.update: backward)
  autogram    TorchJD's autogram engine (torchjd.autogram.Engine, batch_dim=0): the per-example Gramian of the
              same encoder and head, reduced to the T × T Gram of the objectives' mean losses (M G Mᵀ), the same
              exact min-norm weights, then a backward pass of the weighted losses (Quinton & Rey, 2024, Section 6)
  naive       T separate torch.autograd.grad calls for the per-objective gradients, then the same Gram/solve/update
  bufferless_whole (only with --kinds): the bufferless step with every layer's T products formed at once, not in
              chunks of a fixed budget (what it did before the chunks; its memory grows with T)
Peak memory is how far the resident set of a fresh process rises above its level just before the steps (the model
and the engine already built) while it runs only one kind of step (sampled every millisecond; CPU has no allocator
counter as a GPU has; glibc's mmap threshold fixed, so that freed tensors leave the resident set at once). It
includes what the steps keep between steps: the optimizer state (alike for all kinds) and the buffered step's T × P
per-objective buffers.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

os.environ.setdefault("DS_ACCELERATOR", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModel, XLMRobertaConfig  # noqa: E402

from mtft.core.rows import labelled_rows  # noqa: E402
from mtft.gradients import row_sparse_parameters  # noqa: E402
from mtft.gradients.store import TapeStore  # noqa: E402
from mtft.models.checkpointing import enable_checkpointing  # noqa: E402
from mtft.models.heads import SequenceClassificationHead  # noqa: E402
from mtft.models.multitask import MultiTaskModel  # noqa: E402
from mtft.training.gradient_store import gradient_store  # noqa: E402
from mtft.training.gram_step import GramWeightedStep  # noqa: E402
from mtft.training.step import LossWeightedStep, StepResult  # noqa: E402
from mtft.weighting import MeanWeighting, build_weighting  # noqa: E402


def build(num_objectives: int, hidden: int, layers: int, seed: int = 0, checkpointing: bool = False):
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
    if checkpointing:  # training.gradient_checkpointing: every step kind recomputes the encoder's layers
        enable_checkpointing(encoder)
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
        params = [p for p in self.engine.module.parameters() if p.requires_grad]
        sums, counts = self.engine.module(**batch)
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


class PerExampleLosses(torch.nn.Module):
    """The same encoder and head, returning every example's loss: what TorchJD's autogram differentiates."""

    def __init__(self, model: MultiTaskModel):
        super().__init__()
        self.encoder, self.head = model.encoder, model.heads["nli"]

    def forward(self, input_ids, attention_mask, labels, objective_index):
        with labelled_rows(objective=objective_index, task=torch.zeros_like(objective_index)):
            hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            return self.head(hidden, labels, attention_mask=attention_mask).loss_sum


class AutogramStep:
    """TorchJD autogram: Gramian of the per-example losses, the objectives' Gram M G Mᵀ (M_tn = 1/count_t for the
    examples n of objective t), the exact min-norm weights, then the weighted losses' backward through the engine."""

    def __init__(self, engine, num_objectives: int):
        from torchjd.autogram import Engine

        self.engine, self.num_objectives = engine, num_objectives
        self.losses = PerExampleLosses(engine.module)
        self.gramian = Engine(self.losses.encoder, self.losses.head, batch_dim=0)
        self.weighting = build_weighting("lfmlf")

    def __call__(self, micro_batches) -> StepResult:
        (batch,) = list(micro_batches)
        objectives = batch["objective_index"]
        losses = self.losses(batch["input_ids"], batch["attention_mask"], batch["labels"], objectives)
        gramian = self.gramian.compute_gramian(losses)
        counts = torch.bincount(objectives, minlength=self.num_objectives).to(losses.dtype)
        membership = torch.nn.functional.one_hot(objectives, self.num_objectives).t().to(losses.dtype)
        membership = membership / counts.clamp(min=1)[:, None]
        gram = membership @ gramian.to(losses.dtype) @ membership.t()
        w = torch.as_tensor(self.weighting(np.zeros(self.num_objectives), gram.double().numpy()), dtype=losses.dtype)
        per_example = (w / counts.clamp(min=1))[objectives]
        self.engine.backward((losses * per_example).sum())
        self.engine.step()
        return StepResult(losses.detach(), counts, w.double(), 0.0, batch["input_ids"].shape[0])


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


KINDS = ("plain", "buffered", "bufferless", "bufferless_backward", "autogram", "naive", "bufferless_whole")
DEFAULT_KINDS = KINDS[1:6]  # bufferless_whole (every layer's T products at once, as before the chunks): on request


def make_step(kind: str, engine, num_objectives: int, chunk_mb: Optional[float] = None):
    params = [p for p in engine.module.parameters() if p.requires_grad]
    if kind == "plain":
        return LossWeightedStep(engine, MeanWeighting(), num_objectives, 1)
    if kind == "autogram":
        return AutogramStep(engine, num_objectives)
    if kind == "naive":
        return NaiveStep(gradient_store(engine, num_objectives, 1, params), build_weighting("lfmlf"))
    store = gradient_store(
        engine,
        num_objectives,
        1,
        params,
        buffers="none" if kind.startswith("bufferless") else "full",
        update="backward" if kind == "bufferless_backward" else "tape",
        chunk_bytes=None if chunk_mb is None else int(chunk_mb * 2**20),
    )
    if kind == "bufferless_whole":
        assert isinstance(store, TapeStore)
        store.layerwise.chunk_elements = 1 << 62
    step = GramWeightedStep(store, build_weighting("lfmlf"))
    return step


PHASES = ("backward_s", "gram_s", "weighting_s", "combine_s", "optimizer_s")


def time_steps(args) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """Median step time of every kind, and the Gram steps' median time in each phase (their own timers)."""
    model = build(args.objectives, args.hidden, args.layers, checkpointing=args.checkpointing)
    # TorchJD's engine hooks every forward call of the modules it is given, so autogram gets a copy of its own
    twin = copy.deepcopy(model)
    engine, twin_engine = engine_for(model), engine_for(twin)
    batch = make_batch(args.objectives, args.batch, args.length)
    kinds = [k for k in KINDS if k in ("plain", *args.kinds) and (k != "naive" or args.objectives <= args.naive_up_to)]
    steps = {
        kind: make_step(kind, twin_engine if kind == "autogram" else engine, args.objectives, args.chunk_mb)
        for kind in kinds
    }
    times: dict[str, list[float]] = {kind: [] for kind in steps}
    gram_steps = [k for k in ("buffered", "bufferless", "bufferless_backward", "bufferless_whole") if k in kinds]
    phases: dict[str, dict[str, list[float]]] = {kind: {p: [] for p in PHASES} for kind in gram_steps}
    for repeat in range(args.steps + 1):
        for kind, step in steps.items():  # interleaved, so that machine noise hits every kind alike
            if kind == "naive" and repeat > args.naive_steps:
                continue  # T backward passes are slow; a few repetitions suffice for the comparison
            start = time.perf_counter()
            result = step([dict(batch)])
            if repeat:  # the first round warms up
                times[kind].append(time.perf_counter() - start)
                for phase, values in phases.get(kind, {}).items():
                    values.append(result.extras[phase])
    medians = {kind: statistics.median(v) for kind, v in times.items()}
    return medians, {k: {p: statistics.median(v) for p, v in row.items()} for k, row in phases.items()}


def traffic(args, plain_s: float) -> str:
    """A Markdown row: what the buffered step's T × P buffers cost on this machine whatever the code, one write of
    them (the per-objective products), the Gram B Bᵀ (one BLAS call over them) and the combination wᵀB (one read),
    each timed alone on a (T, P) float32 tensor, P the dense trainable parameters the step buffers; and their sum
    against the plain step's time. The buffered step does at least this much beyond a plain step."""
    model = build(args.objectives, args.hidden, args.layers)
    sparse = row_sparse_parameters(model)  # the embeddings: buffered by the rows a step touches, not whole
    dense = sum(p.numel() for p in model.parameters() if p.requires_grad and p not in sparse)
    buffer, source = torch.empty(args.objectives, dense), torch.randn(args.objectives, dense)
    w = torch.rand(args.objectives)
    times: dict[str, list[float]] = {"write": [], "gram": [], "combine": []}
    for repeat in range(args.steps + 1):
        for name, run in (
            ("write", lambda: buffer.copy_(source)),
            ("gram", lambda: buffer @ buffer.t()),
            ("combine", lambda: w @ buffer),
        ):
            start = time.perf_counter()
            run()
            if repeat:
                times[name].append(time.perf_counter() - start)
    ms = {name: statistics.median(values) * 1e3 for name, values in times.items()}
    total = sum(ms.values())
    mib = args.objectives * dense * 4 / 2**20
    return (
        f"| {args.objectives} | {mib:.0f} | {ms['write']:.1f} | {ms['gram']:.1f} | {ms['combine']:.1f} | "
        f"{total:.1f} | {1 + total / (plain_s * 1e3):.3f}× |"
    )


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
        *([] if args.chunk_mb is None else ["--chunk-mb", str(args.chunk_mb)]),
        *(["--checkpointing"] if args.checkpointing else []),
    ]
    out = subprocess.run(
        command,
        capture_output=True,
        text=True,
        check=True,
        # every allocation above 64 KiB its own mapping, returned to the system when freed: glibc otherwise raises
        # its mmap threshold as tensors are freed and keeps later ones in its heap, which made the resident peak
        # wander by ±30 MiB from run to run; with it the peak repeats to the MiB
        env={**os.environ, "MASTER_PORT": str(29600 + args.objectives), "MALLOC_MMAP_THRESHOLD_": "65536"},
    )
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_growth_mib"]


def _rss_mib() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def memory_child(args) -> None:
    """Peak resident memory during the steps minus the resident memory just before the first one, sampled
    every ms (ru_maxrss is a lifetime high-water mark that start-up may already have set)."""
    model = build(args.objectives, args.hidden, args.layers, checkpointing=args.checkpointing)
    engine = engine_for(model)
    batch = make_batch(args.objectives, args.batch, args.length)
    step = make_step(args.memory_of, engine, args.objectives, args.chunk_mb)
    base, peak = peak_rss_during(lambda: [step([dict(batch)]) for _ in range(args.steps)])
    print(json.dumps({"peak_growth_mib": peak - base}))


def peak_rss_during(work) -> tuple[float, float]:
    """(resident set before ``work()``, its peak while ``work()`` runs), in MiB, sampled every millisecond
    (ru_maxrss is a lifetime high-water mark that start-up may already have set)."""
    peak, done = [0.0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss_mib())
            time.sleep(0.001)

    base = _rss_mib()
    sampler = threading.Thread(target=sample)
    sampler.start()
    work()
    done.set()
    sampler.join()
    return base, max(peak[0], base)


def bytes_table(objectives: int = 48) -> None:
    """What the step holds beyond the model, by formula, for XLM-R base and large on one GPU (float32 gradients,
    bf16 activations), per micro-batch of 32 sequences of 128 tokens: the buffered step's T × P buffers; the
    bufferless step's tape (every trainable layer's input and output gradient: per encoder layer q, k, v, attention
    output, intermediate and output dense, two LayerNorms, in bf16); and the activations autograd keeps (a
    transformer layer's ~34·s·b·h + 5·a·s²·b bytes in 16-bit, Korthikanti et al., 2022, eq. 2), all of it without
    checkpointing, one layer's plus every layer's input with it. Full fine-tuning; the embedding's rows counted at
    the tokens of the batch."""
    print(f"\nBytes by formula, T = {objectives}, micro-batch 32 × 128 tokens, full fine-tuning (GiB):\n")
    print("| model | T × P buffers (float32) | tape (bf16) | activations | activations, checkpointed |")
    print("|---|---:|---:|---:|---:|")
    b, s = 32, 128
    for name, h, layers, heads in (("XLM-R base", 768, 12, 12), ("XLM-R large", 1024, 24, 16)):
        dense = layers * (12 * h * h + 13 * h)  # the encoder layers' weights and biases (4h² attention, 8h² FFN)
        rows = min(250002, b * s)  # the embedding rows a step can touch
        buffers = objectives * (dense + rows * h) * 4
        # inputs 9h per token (q/k/v share one; attention output, intermediate, output 4h, two LayerNorms), output
        # gradients 11h (q, k, v, attention output, intermediate 4h, output, two LayerNorms)
        tape_per_layer = b * s * 20 * h * 2
        activations_per_layer = 34 * s * b * h + 5 * heads * s * s * b
        full = layers * activations_per_layer
        checkpointed = layers * 2 * s * b * h + activations_per_layer
        print(
            f"| {name} | {buffers / GIB:.1f} | {layers * tape_per_layer / GIB:.2f} | {full / GIB:.2f} | "
            f"{checkpointed / GIB:.2f} |"
        )


GIB = 2**30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objectives", type=int, nargs="*", default=[2, 8, 15, 48, 100])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=48)
    parser.add_argument("--length", type=int, default=96)
    parser.add_argument("--steps", type=int, default=9, help="timed steps of every kind but naive")
    parser.add_argument("--naive-steps", type=int, default=2, help="timed steps of the naive method")
    parser.add_argument("--naive-up-to", type=int, default=48, help="largest T the naive method runs at")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    parser.add_argument(
        "--kinds", nargs="*", choices=KINDS[1:], default=list(DEFAULT_KINDS), help="steps against plain"
    )
    parser.add_argument("--bytes", action="store_true", help="print the bytes table by formula only")
    parser.add_argument(
        "--chunk-mb",
        type=float,
        help="the bufferless steps' chunk budget (gradients.chunk_mb; default: theirs)",
    )
    parser.add_argument(
        "--checkpointing",
        action="store_true",
        help="activation checkpointing of the encoder's layers in every kind (training.gradient_checkpointing)",
    )
    parser.add_argument(
        "--traffic",
        action="store_true",
        help="also time one write, the Gram and the combination of a (T, P) buffer alone: the buffered step's floor",
    )
    parser.add_argument("--memory-of", choices=KINDS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_of:
        args.objectives = args.objectives[0] if isinstance(args.objectives, list) else args.objectives
        return memory_child(args)
    if args.bytes:
        return bytes_table()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1)))
    print(
        f"model: XLM-R-style encoder, hidden {args.hidden}, {args.layers} layers, vocab 8000; batch "
        f"{args.batch} x {args.length} tokens (padded); medians of {args.steps} (naive: {args.naive_steps}) "
        f"interleaved timed steps; {torch.get_num_threads()} threads"
        + ("; activation checkpointing of every layer" if args.checkpointing else "")
        + "\n"
    )
    others = tuple(k for k in KINDS[1:] if k in args.kinds)
    print("| T | plain (ms) | " + " | ".join(f"{k} ÷ plain" for k in others) + " |")
    print("|---:|---:|" + "---:|" * len(others))
    memory: dict[int, dict[str, float]] = {}
    profiles: dict[int, dict[str, dict[str, float]]] = {}
    floors: list[str] = []
    for t in args.objectives:
        one = argparse.Namespace(**{**vars(args), "objectives": t})
        med, profiles[t] = time_steps(one)
        if args.traffic:
            floors.append(traffic(one, med["plain"]))
        ratios = [f"{med[k] / med['plain']:.3f}×" if k in med else "–" for k in others]
        print(f"| {t} | {med['plain'] * 1e3:.1f} | " + " | ".join(ratios) + " |", flush=True)
        if not args.no_memory:
            memory[t] = {k: peak_memory(one, k) for k in ("plain", *others) if k != "naive" or t <= args.naive_up_to}
    print("\nWhere the Gram steps' time goes (median ms per phase; forward and backward passes together):\n")
    print("| T | step | " + " | ".join(p.removesuffix("_s") for p in PHASES) + " |")
    print("|---:|---|" + "---:|" * len(PHASES))
    for t, rows in profiles.items():
        for kind, row in rows.items():
            print(f"| {t} | {kind} | " + " | ".join(f"{row[p] * 1e3:.1f}" for p in PHASES) + " |")
    if floors:
        print("\nThe buffered step's floor: its T × P buffers written once, their Gram and their combination, each")
        print("timed alone (median ms), and 1 + their sum ÷ the plain step's time:\n")
        print("| T | T × P (MiB) | write | Gram | combine | sum | floor ÷ plain |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        print("\n".join(floors))
    if memory:
        print("\nPeak memory above the built model and engine (MiB; ratio to plain):\n")
        print("| T | plain | " + " | ".join(others) + " |")
        print("|---:|---:|" + "---:|" * len(others))
        for t, row in memory.items():
            cells = [f"{row[k]:.0f} ({row[k] / row['plain']:.2f}×)" if k in row else "–" for k in others]
            print(f"| {t} | {row['plain']:.0f} | " + " | ".join(cells) + " |", flush=True)
    bytes_table()


if __name__ == "__main__":
    main()
