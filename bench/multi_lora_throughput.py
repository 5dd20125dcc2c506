"""Training throughput of Shared-A Multi-LoRA on a mixed batch of k tasks, against single-adapter LoRA.

    python bench/multi_lora_throughput.py                 # k = 8 tasks; prints a Markdown table
    python bench/multi_lora_throughput.py --tasks 4 --hidden 768 --layers 2

Three training steps (forward, backward, AdamW step) on the same encoder, batch and task heads, measured side by
side (interleaved, median over --steps repetitions) in one process:
  single      one PEFT LoRA adapter for the whole batch: no routing (the upper bound)
  multi_lora  mtft's Shared-A Multi-LoRA: A·x once, every row's own task B by one batched product
  peft_loop   one PEFT LoRA adapter per task, the mixed batch routed through PEFT's ``adapter_names``, which
              loops over the tasks with sub-batches (what PEFT does at inference; mtft's ``lora`` method)
Examples per second and the ratios to ``single`` are printed; the target for multi_lora is ≥ 0.9× single.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import peft  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModel, XLMRobertaConfig  # noqa: E402

from mtft.adapters.lora import inject_lora  # noqa: E402
from mtft.adapters.multi_lora import inject_multi_lora  # noqa: E402
from mtft.adapters.options import MultiLoraOptions  # noqa: E402
from mtft.models.heads import SequenceClassificationHead  # noqa: E402
from mtft.models.multitask import MultiTaskModel  # noqa: E402


def build(kind: str, tasks: int, hidden: int, layers: int, r: int, targets: list[str]) -> MultiTaskModel:
    torch.manual_seed(0)
    config = XLMRobertaConfig(
        vocab_size=8000,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64),
        intermediate_size=4 * hidden,
        max_position_embeddings=260,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    encoder = AutoModel.from_config(config, add_pooling_layer=False)
    names = [f"task{i}" for i in range(tasks)]
    if kind == "multi_lora":
        inject_multi_lora(encoder, MultiLoraOptions(r=r, target_modules=targets), tasks, seed=0)
    elif kind == "peft_loop":
        inject_lora(encoder, peft.LoraConfig(r=r, lora_alpha=16, target_modules=targets), names)
    else:
        encoder.requires_grad_(False)
        encoder = peft.inject_adapter_in_model(peft.LoraConfig(r=r, lora_alpha=16, target_modules=targets), encoder)
    heads = {name: SequenceClassificationHead(hidden, ["a", "b", "c"], 0.0) for name in names}
    return MultiTaskModel(encoder, heads, num_objectives=tasks)


def make_batch(tasks: int, batch: int, length: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    task = torch.arange(batch) % tasks  # every task in every batch, interleaved as a sampler mixes them
    return {
        "input_ids": torch.randint(5, 8000, (batch, length), generator=g),
        "attention_mask": torch.ones(batch, length, dtype=torch.long),
        "labels": torch.randint(0, 3, (batch,), generator=g),
        "head_index": task,
        "objective_index": task,
    }


def step_fn(model: MultiTaskModel, batch: dict):
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)

    def step() -> float:
        start = time.perf_counter()
        sums, counts = model(**batch)
        (sums / counts.clamp(min=1)).sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--r", type=int, default=8)
    parser.add_argument("--targets", default="query,value")
    parser.add_argument("--steps", type=int, default=15)
    args = parser.parse_args()
    kinds = ["single", "multi_lora", "peft_loop"]
    batch = make_batch(args.tasks, args.batch, args.length)
    steps = {
        k: step_fn(build(k, args.tasks, args.hidden, args.layers, args.r, args.targets.split(",")), batch)
        for k in kinds
    }
    times = {k: [] for k in kinds}
    for k in kinds:  # warm-up
        steps[k]()
    for _ in range(args.steps):
        for k in kinds:  # interleaved, so that drifts of a shared machine hit every kind alike
            times[k].append(steps[k]())
    median = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"k = {args.tasks} tasks, batch {args.batch} × {args.length} tokens, hidden {args.hidden}, "
        f"{args.layers} layers, r = {args.r}, targets {args.targets}, {torch.get_num_threads()} threads, "
        f"median of {args.steps} steps\n"
    )
    print("| step | examples/s | ÷ single | ÷ peft_loop |")
    print("|---|---|---|---|")
    for k in kinds:
        throughput = args.batch / median[k]
        print(
            f"| {k} | {throughput:.1f} | {median['single'] / median[k]:.3f} | {median['peft_loop'] / median[k]:.3f} |"
        )


if __name__ == "__main__":
    main()
