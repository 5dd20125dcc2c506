"""A masked-LM head fitted to the frozen pre-trained encoder θ_p, for a backbone whose checkpoint ships none.

L_p (Mao et al., 2022, Theorem 1) is the masked-LM loss of the pre-trained model. A checkpoint without a masked-LM
head -- sentence-transformers' all-MiniLM-L6-v2 is a bare ``BertModel`` -- cannot give it, and a head initialised
at random gives a number that measures nothing. The head is therefore fitted once to θ_p, with θ_p frozen, on
``corpus.train_split`` (never on the held-out texts L_p is measured on), and kept fixed for the run: L_p is then
*the masked-LM loss through a head fitted to θ_p*, and F_p = L_p(θ) − L_p(θ_p) how much worse the fine-tuned
encoder serves that fixed head.

- The decoder stays tied to the input word embeddings, as in every BERT and XLM-R masked-LM (BERT's
  ``cls.predictions``: dense + GELU + LayerNorm, then embeddingsᵀ + bias). Only the transform and the output bias
  are fitted -- 0.18 M parameters for MiniLM against 11.7 M for an untied 30522 × 384 decoder -- which a few hundred
  steps on a small corpus fit without memorising it; and the decoder follows the fine-tuned embeddings as a
  pre-trained head does (:mod:`mtft.forgetting.mlm`), so moving the embeddings shows in L_p. (A model class whose
  decoder is not tied fits its decoder too: slower, same meaning.)
- θ_p is frozen, so the encoder runs once: every text is masked ``masks`` times (BERT's 80/10/10 scheme) and the
  hidden states at the masked positions are kept; Adam then fits the head on them alone.
- The head is cached under a hash of θ_p (every encoder parameter), the tokenizer, the texts and the settings:
  ``<cache>/mlm_heads/<key>/`` holds ``head.safetensors`` and ``fit.json`` (losses, counts, seconds), written
  completely or not at all by one process while concurrent runs wait for it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from mtft.config.paths import cache_dir
from mtft.config.schema import CorpusSection, DataSection, HeadFitSection
from mtft.core.atomic import AtomicFolder, is_complete, recover, write_json
from mtft.core.distributed import barrier
from mtft.core.errors import ConfigError
from mtft.core.labels import IGNORE_INDEX
from mtft.core.runlock import waiting_lock
from mtft.forgetting.corpus import corpus_path, corpus_texts, masking_collator
from mtft.forgetting.mlm import split_mlm_model
from mtft.reporting.logs import logger


@dataclass(frozen=True)
class _Fit:
    """What the fit reads from the config: ``forgetting.head_fit``, ``corpus.mlm_probability``, ``data.max_length``."""

    settings: HeadFitSection
    mlm_probability: float
    max_length: int


FIT_VERSION = "1"  # bump when the fit changes what it produces, to invalidate cached heads
ENCODE_BATCH = 64  # texts per encoder forward while collecting features


def fitted_head(
    mlm_model: nn.Module,
    tokenizer,
    settings: HeadFitSection,
    corpus: CorpusSection,
    data: DataSection,
    languages: list[str],
    backbone: str,
) -> str:
    """Fit (or load from the cache) the masked-LM head of ``mlm_model`` to its frozen encoder, in place, by
    ``settings`` (``forgetting.head_fit``) on ``corpus``'s training texts; returns how L_p is obtained, one sentence
    for the log and the report. Every rank calls it; rank 0 fits."""
    texts = {lang: corpus_texts(corpus, data, lang, corpus.train_split, settings.examples) for lang in languages}
    encoder, head, tied = split_mlm_model(mlm_model)
    fit = _Fit(settings, corpus.mlm_probability, data.max_length)
    folder = cache_dir(data) / "mlm_heads" / _cache_key(mlm_model, head, tokenizer, texts, fit)
    cached = is_complete(folder)
    if not cached:
        main = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
        lock = folder.parent / f".{folder.name}.lock"
        holding = waiting_lock(lock, lambda: logger.info(f"waiting for another run fitting {folder}"))
        with holding if main else contextlib.nullcontext():
            barrier()
            recover(folder)
            if main and not is_complete(folder):
                _fit_into(folder, mlm_model, head, tied, tokenizer, texts, fit, corpus, backbone)
            barrier()
    summary = _load_into(folder, head, tied)
    source = corpus.path or "built-in generic-text"
    how = (
        f"a masked-LM head fitted to θ_p (the checkpoint {Path(backbone).name} has none): {summary['steps']} Adam "
        f"steps on {summary['masked_tokens']:,} masked tokens of {summary['texts']:,} {source} "
        f"{corpus.train_split} texts ({', '.join(languages)}), training loss {summary['loss_first']:.3f} -> "
        f"{summary['loss_last']:.3f}"
    )
    logger.info(f"forgetting: L_p through {how}{'; from the cache' if cached else ''} ({folder})")
    return how


def _fit_into(
    folder: Path, mlm_model, head, tied, tokenizer, texts, fit: "_Fit", corpus: CorpusSection, backbone: str
) -> None:
    settings = fit.settings
    start = time.perf_counter()
    features, labels = _masked_features(mlm_model, tokenizer, texts, fit)
    if not len(labels):
        raise ConfigError(
            f"corpus {corpus_path(corpus)}: no token was masked in its {corpus.train_split} texts; "
            "the masked-LM head of L_p cannot be fitted (raise forgetting.head_fit.examples or corpus.mlm_probability)"
        )
    weight = None if tied is None else tied.weight
    fitted = [p for p in head.parameters() if p is not weight]
    count = sum(p.numel() for p in fitted)
    logger.info(
        f"forgetting: {backbone} has no masked-LM head; fitting one to the frozen θ_p ({count:,} parameters, "
        f"{settings.steps} steps on {len(labels):,} masked tokens) -> {folder}"
    )
    losses = _fit(head, fitted, features, labels, settings, getattr(mlm_model.config, "initializer_range", 0.02))
    window = max(1, len(losses) // 10)
    first, last = sum(losses[:window]) / window, sum(losses[-window:]) / window
    if not math.isfinite(last):
        raise ConfigError(
            f"the masked-LM head fitted to θ_p diverged (training loss {last}); lower forgetting.head_fit.lr, "
            "or set forgetting.enabled=false"
        )
    summary = {
        "backbone": backbone,
        "steps": settings.steps,
        "lr": settings.lr,
        "batch_tokens": settings.batch_tokens,
        "texts": sum(len(t) for t in texts.values()),
        "masked_tokens": len(labels),
        "fitted_parameters": count,
        "tied_decoder": tied is not None,
        "loss_first": first,
        "loss_last": last,
        "seconds": time.perf_counter() - start,
    }
    with AtomicFolder(folder).writing(kind="mlm_head", backbone=backbone) as partial:
        save_file(
            {name: p.detach().contiguous() for name, p in _fitted_named(head, tied)}, str(partial / "head.safetensors")
        )
        write_json(partial / "fit.json", summary)


@torch.no_grad()
def _masked_features(mlm_model, tokenizer, texts: dict[str, list[str]], fit: "_Fit"):
    """Hidden states of the frozen encoder at masked positions, and their target tokens (``masks`` maskings)."""
    settings = fit.settings
    encoder = split_mlm_model(mlm_model)[0]
    collator = masking_collator(tokenizer, fit.mlm_probability, seed=settings.seed)
    encoded = tokenizer([t for ts in texts.values() for t in ts], truncation=True, max_length=fit.max_length)
    rows = [{"input_ids": ids} for ids in encoded["input_ids"]]
    features, labels = [], []
    was_training = encoder.training
    encoder.eval()
    try:
        for _ in range(settings.masks):
            for start in range(0, len(rows), ENCODE_BATCH):
                batch = collator(rows[start : start + ENCODE_BATCH])
                hidden = encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
                targets = batch["labels"] != IGNORE_INDEX
                features.append(hidden[targets])
                labels.append(batch["labels"][targets])
    finally:
        encoder.train(was_training)
    return torch.cat(features).float(), torch.cat(labels)


def _fit(head: nn.Module, fitted: list[nn.Parameter], features, labels, settings, init_std: float) -> list[float]:
    """Adam on ``fitted`` (the head's own parameters) from a seeded initialisation; the training loss per step."""
    generator = torch.Generator().manual_seed(settings.seed)
    _initialise(head, fitted, init_std, generator)
    frozen = [p for p in head.parameters() if all(p is not q for q in fitted)]
    states = [p.requires_grad for p in frozen]
    for p in frozen:
        p.requires_grad_(False)  # the tied decoder is θ_p's word embedding: it stays as it is
    optimizer = torch.optim.Adam(fitted, lr=settings.lr)
    head.train()
    losses, queue = [], torch.empty(0, dtype=torch.long)
    try:
        for _ in range(settings.steps):
            while len(queue) < settings.batch_tokens:  # a fresh permutation of the tokens per pass
                queue = torch.cat([queue, torch.randperm(len(labels), generator=generator)])
            rows, queue = queue[: settings.batch_tokens], queue[settings.batch_tokens :]
            loss = nn.functional.cross_entropy(head(features[rows]).float(), labels[rows])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
    finally:
        for p, state in zip(frozen, states):
            p.requires_grad_(state)
        head.eval()
    return losses


@torch.no_grad()
def _initialise(head: nn.Module, fitted: list[nn.Parameter], std: float, generator: torch.Generator) -> None:
    """BERT's initialisation of the head's own parameters, from ``generator``: linear weights N(0, std²),
    LayerNorm weights 1, every bias 0. (transformers initialised them from the global RNG on load.)"""
    norms = {id(m.weight) for m in head.modules() if isinstance(m, nn.LayerNorm) and m.weight is not None}
    for p in fitted:
        if id(p) in norms:
            p.fill_(1.0)
        elif p.dim() >= 2:
            p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float32) * std)
        else:
            p.zero_()


def _fitted_named(head: nn.Module, tied) -> list[tuple[str, nn.Parameter]]:
    weight = None if tied is None else tied.weight
    return [(name, p) for name, p in head.named_parameters() if p is not weight]


def _load_into(folder: Path, head: nn.Module, tied) -> dict:
    """The cached head's parameters into ``head`` (its tied decoder stays the encoder's embedding); fit.json."""
    try:
        saved = load_file(str(folder / "head.safetensors"))
        summary = json.loads((folder / "fit.json").read_text(encoding="utf-8"))
        with torch.no_grad():
            for name, p in _fitted_named(head, tied):
                p.copy_(saved[name])
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise ConfigError(f"the cached masked-LM head {folder} cannot be read ({exc}); remove the folder") from None
    return summary


def _cache_key(mlm_model, head: nn.Module, tokenizer, texts: dict[str, list[str]], fit: "_Fit") -> str:
    """A hash of everything the fitted head depends on: θ_p, the head's architecture, tokenizer, texts, settings."""
    parts = {
        "version": FIT_VERSION,
        "settings": fit.settings.model_dump(mode="json"),
        "mlm_probability": fit.mlm_probability,
        "max_length": fit.max_length,
        "model_class": type(mlm_model).__name__,
        "head": [(name, list(p.shape)) for name, p in head.named_parameters()],
    }
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode())
    digest.update(tokenizer.backend_tokenizer.to_str().encode())
    for language, items in texts.items():
        digest.update(language.encode() + b"\0")
        for text in items:
            digest.update(text.encode("utf-8") + b"\0")
    for name, param in split_mlm_model(mlm_model)[0].named_parameters():  # θ_p
        digest.update(name.encode())
        digest.update(param.detach().float().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:24]
