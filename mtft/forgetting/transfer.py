"""Does pre-training on the fixture world make the tiny encoder cross-lingual? A small, direct experiment.

Pre-train the tiny XLM-R (masked-LM, the library's tokenizer, packing and masking) on the generic text of the fixture
world (:mod:`mtft.fixtures.generic_text`), fine-tune it with a linear head on the ``<s>`` state on the XNLI fixtures
of the source languages only, and score every language (zero-shot on the targets). Three encoders answer where
transfer comes from: the pre-trained one, the same architecture randomly initialised (averaged over several
initialisations), and one pre-trained on a world whose languages share only the grammar -- no word, no fact, no
parallel or code-switched sentence (``shared=False``). Cross-lingual retrieval (:mod:`mtft.forgetting.retrieval`) on
the parallel held-out text is measured at θ_p and as fine-tuning goes on, at several learning rates: the cross-lingual
knowledge fine-tuning forgets.

A plain PyTorch loop on one process (no DeepSpeed, dropout off): seconds for the reduced setting of
``tests/unit/forgetting/test_transfer.py``, two to three minutes per pre-training for the default one of
``python -m mtft.forgetting.transfer`` (docs/fixtures.md).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

import torch
from transformers import AutoModelForMaskedLM, XLMRobertaConfig

from mtft.fixtures import generic_text, xnli
from mtft.forgetting.corpus import masking_collator, packed_blocks
from mtft.forgetting.mlm import MaskedLM, split_mlm_model
from mtft.forgetting.retrieval import RetrievalSet, aligned
from mtft.models.tokenizer import tiny_tokenizer


@dataclass(frozen=True)
class Setting:
    languages: tuple[str, ...] = ("en", "de", "ar", "zh")
    sources: tuple[str, ...] = ("en",)
    shared: bool = True  # the world of translations; False: each language its own world, no code-switching
    hidden_size: int = 64
    layers: int = 2
    vocab_size: int = 2000
    block_size: int = 32
    batch_size: int = 32
    pretrain_steps: int = 8000  # 2,000 left the encoder too little cross-lingual to transfer (docs/results.md)
    pretrain_lr: float = 3e-3
    finetune_steps: int = 150
    finetune_lr: float = 1e-3
    retrieval_sentences: int = 100
    seed: int = 0

    @property
    def targets(self) -> list[str]:
        return [lang for lang in self.languages if lang not in self.sources]


@dataclass
class Backbone:
    tokenizer: object
    config: XLMRobertaConfig
    encoder: torch.nn.Module  # pre-trained, or freshly initialised
    loss: Optional[float] = None  # the masked-LM loss of the last pre-training steps


def world_texts(setting: Setting, split: str) -> dict[str, list[str]]:
    count = generic_text.SPLITS[split]
    return {
        lang: [r["text"] for r in generic_text.rows(lang, split, count, setting.shared, setting.languages)]
        for lang in setting.languages
    }


def architecture(setting: Setting, texts: dict[str, list[str]], cache_dir: Path) -> tuple[object, XLMRobertaConfig]:
    """The tokenizer (trained on ``texts``, the world's training text) and the tiny XLM-R configuration."""
    tokenizer = tiny_tokenizer([t for ts in texts.values() for t in ts], setting.vocab_size, cache_dir)
    config = XLMRobertaConfig(
        vocab_size=len(tokenizer),
        hidden_size=setting.hidden_size,
        num_hidden_layers=setting.layers,
        num_attention_heads=4,
        intermediate_size=2 * setting.hidden_size,
        max_position_embeddings=130,
        type_vocab_size=1,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return tokenizer, config


def pretrain(setting: Setting, cache_dir: Path) -> Backbone:
    """Masked-LM pre-training from scratch on the world's training text, cosine schedule with 5% warm-up."""
    texts = world_texts(setting, "train")
    tokenizer, config = architecture(setting, texts, cache_dir)
    torch.manual_seed(setting.seed)
    mlm = AutoModelForMaskedLM.from_config(config)
    # the loss through the head at the masked positions only (mtft.forgetting.mlm), not logits at every position:
    # the same loss, at 15% of the head's cost (about a fifth of this tiny encoder's step at one thread); foreach:
    # one kernel per update for all its tensors
    masked_lm = MaskedLM(*split_mlm_model(mlm))
    blocks = [b for ts in texts.values() for b in packed_blocks(tokenizer, ts, setting.block_size)]
    collator = masking_collator(tokenizer, 0.15, seed=setting.seed)
    optimizer = torch.optim.AdamW(mlm.parameters(), lr=setting.pretrain_lr, weight_decay=0.01, foreach=True)
    warmup = max(1, setting.pretrain_steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: min((s + 1) / warmup, 0.5 * (1 + math.cos(math.pi * s / setting.pretrain_steps))),
    )
    order = torch.Generator().manual_seed(setting.seed)
    losses = []
    for _ in range(setting.pretrain_steps):
        rows = torch.randint(len(blocks), (setting.batch_size,), generator=order).tolist()
        batch = collator([{"input_ids": blocks[i]} for i in rows])
        total, count = masked_lm(batch["input_ids"], batch["attention_mask"], batch["labels"])
        loss = total / count
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(float(loss.detach()))
    tail = losses[-50:]
    return Backbone(tokenizer, config, mlm.base_model, sum(tail) / len(tail))


def random_inits(setting: Setting, cache_dir: Path, count: int) -> list[Backbone]:
    """``count`` initialisations of the same architecture and tokenizer, nothing pre-trained. On a target language
    such an encoder's prediction is a fixed, arbitrary function of random embeddings of words it never saw in
    fine-tuning: right by chance, but per initialisation all or nothing (a language's accuracy lands near 0, 1/3, 2/3
    or 1), so the control is read over several."""
    tokenizer, config = architecture(setting, world_texts(setting, "train"), cache_dir)
    inits = []
    for init in range(count):
        torch.manual_seed(1000 * setting.seed + init + 1)
        inits.append(Backbone(tokenizer, config, AutoModelForMaskedLM.from_config(config).base_model))
    return inits


def retrieval_set(backbone: Backbone, setting: Setting) -> RetrievalSet:
    """The first language with each other one, on the world's parallel held-out text."""
    held_out = world_texts(setting, "validation")
    pivot, others = setting.languages[0], setting.languages[1:]
    bitexts = [aligned(f"{pivot}-{o}", held_out[pivot], held_out[o], setting.retrieval_sentences) for o in others]
    return RetrievalSet(bitexts, backbone.tokenizer, 128, 64)


def retrieval(encoder: torch.nn.Module, bitexts: RetrievalSet, layer: Optional[int] = None) -> float:
    """The mean retrieval accuracy over the pairs (``layer``'s states, default the last, mean-pooled; both
    directions)."""
    encoder.eval()

    def encode(batch):
        out = encoder(**batch, output_hidden_states=layer is not None)
        return out.last_hidden_state if layer is None else out.hidden_states[layer]

    return bitexts.accuracy(encode, "cpu")["retrieval"]


def _encode(tokenizer, rows: list[dict]) -> dict[str, torch.Tensor]:
    return dict(
        tokenizer(
            [r["premise"] for r in rows],
            [r["hypothesis"] for r in rows],
            padding=True,
            return_tensors="pt",
            return_token_type_ids=False,
        )
    )


def finetune(
    backbone: Backbone,
    setting: Setting,
    lr: Optional[float] = None,
    steps: Optional[int] = None,
    bitexts: Optional[RetrievalSet] = None,
    every: int = 0,
    layer: Optional[int] = None,
) -> dict:
    """Fine-tune a copy of the encoder on the sources' XNLI fixtures; accuracy per language on validation, and (with
    ``bitexts`` and ``every``) the retrieval accuracy (of ``layer``) at step 0 and every ``every`` steps."""
    lr = setting.finetune_lr if lr is None else lr
    steps = setting.finetune_steps if steps is None else steps
    encoder = AutoModelForMaskedLM.from_config(backbone.config).base_model
    encoder.load_state_dict(backbone.encoder.state_dict())
    torch.manual_seed(setting.seed + 2)
    head = torch.nn.Linear(setting.hidden_size, len(xnli.LABELS))
    params = list(encoder.parameters()) + list(head.parameters())
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    train = [r for lang in setting.sources for r in xnli.nli_rows(lang, "train", 600, "xnli", setting.shared)]
    rng = random.Random(setting.seed)
    curve = []
    for step in range(steps + 1):
        if bitexts is not None and every and step % every == 0:
            with torch.no_grad():
                curve.append((step, retrieval(encoder, bitexts, layer)))
        if step == steps:
            break
        encoder.train()
        batch = rng.sample(train, setting.batch_size)
        logits = head(encoder(**_encode(backbone.tokenizer, batch)).last_hidden_state[:, 0])
        loss = torch.nn.functional.cross_entropy(logits, torch.tensor([r["label"] for r in batch]))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    encoder.eval()
    accuracy = {}
    with torch.no_grad():
        for lang in setting.languages:
            rows = xnli.nli_rows(lang, "validation", 150, "xnli", setting.shared)
            predicted = head(encoder(**_encode(backbone.tokenizer, rows)).last_hidden_state[:, 0]).argmax(-1)
            accuracy[lang] = float((predicted == torch.tensor([r["label"] for r in rows])).double().mean())
    return {"accuracy": accuracy, "retrieval": curve}


def macro(accuracy: dict[str, float], languages: list[str]) -> float:
    return sum(accuracy[lang] for lang in languages) / len(languages)


def per_language(accuracy: dict[str, float], languages: list[str]) -> str:
    return ", ".join(f"{lang} {accuracy[lang]:.2f}" for lang in languages)


ENCODERS = ("translations", "random", "independent")


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--languages", default="en,de,ar,zh", help="the first ones up to --sources are sources")
    parser.add_argument("--sources", default="en")
    parser.add_argument("--pretrain-steps", type=int, default=Setting.pretrain_steps)
    parser.add_argument("--finetune-steps", type=int, default=300)
    parser.add_argument("--lrs", default="1e-4,3e-4,1e-3", help="fine-tuning learning rates of the forgetting curve")
    parser.add_argument("--every", type=int, default=50, help="retrieval every N fine-tuning steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layer", type=int, default=1, help="layer of the retrieval curves (0: the embeddings)")
    parser.add_argument(
        "--encoders",
        default=",".join(ENCODERS),
        help="which rows: pre-trained on the world of translations (and its retrieval curves), randomly initialised, "
        "pre-trained on the independent world",
    )
    parser.add_argument("--random-inits", type=int, default=5, help="initialisations the random-init row averages")
    args = parser.parse_args(argv)
    encoders = args.encoders.split(",")
    if not set(encoders) <= set(ENCODERS) or args.random_inits < 1:
        parser.error(f"--encoders takes a comma list of {', '.join(ENCODERS)}; --random-inits at least 1")
    torch.set_num_threads(1)
    base = Setting(
        languages=tuple(args.languages.split(",")),
        sources=tuple(args.sources.split(",")),
        pretrain_steps=args.pretrain_steps,
        seed=args.seed,
    )
    print(
        f"languages {', '.join(base.languages)}; sources {', '.join(base.sources)}; targets "
        f"{', '.join(base.targets)}; chance 1/3\n"
    )
    print(
        f"| world | encoder | MLM loss | retrieval at θ_p, layer {args.layer} | retrieval at θ_p, last layer | "
        "source accuracy | target accuracy (per target) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp)
        pre = None
        if "translations" in encoders:
            start = time.perf_counter()
            pre = pretrain(base, cache)
            _row("translations", f"pre-trained ({time.perf_counter() - start:.0f} s)", [pre], base, args.layer)
        if "random" in encoders:
            inits = random_inits(base, cache, args.random_inits)
            _row("translations", f"random init (mean of {len(inits)})", inits, base, args.layer)
        if "independent" in encoders:
            independent = replace(base, shared=False)
            start = time.perf_counter()
            other = pretrain(independent, cache)
            _row("independent", f"pre-trained ({time.perf_counter() - start:.0f} s)", [other], independent, args.layer)
        if pre is not None:
            _curves(pre, base, args)


def _row(world: str, name: str, backbones: list[Backbone], setting: Setting, layer: int) -> None:
    """One table row: the means over ``backbones`` (± the standard deviation of the target macro when several)."""
    results = [finetune(backbone, setting)["accuracy"] for backbone in backbones]
    bitexts = retrieval_set(backbones[0], setting)  # one tokenizer for all
    middle = statistics.mean(retrieval(b.encoder, bitexts, layer) for b in backbones)
    last = statistics.mean(retrieval(b.encoder, bitexts) for b in backbones)
    losses = [b.loss for b in backbones if b.loss is not None]
    targets = [macro(r, setting.targets) for r in results]
    spread = f" ± {statistics.stdev(targets):.3f}" if len(targets) > 1 else ""
    mean = {lang: statistics.mean(r[lang] for r in results) for lang in setting.languages}
    print(
        f"| {world} | {name} | {f'{statistics.mean(losses):.2f}' if losses else '–'} | {middle:.3f} | {last:.3f} | "
        f"{macro(mean, list(setting.sources)):.3f} | {statistics.mean(targets):.3f}{spread} "
        f"({per_language(mean, setting.targets)}) |",
        flush=True,
    )


def _curves(pre: Backbone, setting: Setting, args: argparse.Namespace) -> None:
    bitexts = retrieval_set(pre, setting)
    print(f"\nretrieval (layer {args.layer}) during fine-tuning (translations, {args.finetune_steps} steps):\n")
    curves = {
        lr: finetune(pre, setting, float(lr), args.finetune_steps, bitexts, args.every, args.layer)
        for lr in args.lrs.split(",")
    }
    steps = [step for step, _ in next(iter(curves.values()))["retrieval"]]
    print("| lr | " + " | ".join(f"step {s}" for s in steps) + " | target accuracy at the end |")
    print("|---:|" + "---:|" * (len(steps) + 1))
    for lr, result in curves.items():
        print(
            f"| {lr} | "
            + " | ".join(f"{value:.3f}" for _, value in result["retrieval"])
            + f" | {macro(result['accuracy'], setting.targets):.3f} |"
        )


if __name__ == "__main__":
    main()
