"""Cross-lingual sentence retrieval: how much of the encoder's cross-lingual knowledge survives fine-tuning.

Tatoeba/BUCC-style bitext retrieval (Artetxe & Schwenk, 2019, "Massively multilingual sentence embeddings"; the
XTREME Tatoeba task, Hu et al., 2020): each sentence is the mean of the encoder's last hidden states over its
non-padding tokens, and a source sentence retrieves the target sentence of highest cosine similarity. The accuracy
of a language pair is the share of sentences whose nearest neighbour is their own translation, averaged over BOTH
directions (source → target and target → source). Pairs in which either side repeats an earlier text are dropped
before the cut to ``max_sentences`` (a repeated text has two correct neighbours).

Parallel text comes through the same :func:`mtft.data.sources.load_split` as task data, in one of two layouts:

- one config per language (``name`` with ``{language}``, one ``text_column``), row ``i`` of every language a
  translation of row ``i`` of every other: the built-in generic text (its held-out split is parallel);
- one config per pair (``name`` with ``{source}`` and ``{target}``, two ``columns``), as the Tatoeba bitext
  datasets on the Hub (``mteb/tatoeba-bitext-mining``: configs ``deu-eng``, columns ``sentence1``/``sentence2``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from mtft.config.schema import (
    LANGUAGE_FIELDS,
    PAIR_FIELDS,
    CorpusSection,
    DataSection,
    ForgettingSection,
    RetrievalSection,
)
from mtft.core.errors import ConfigError, DataError
from mtft.core.templates import check_template, fill_template
from mtft.data.sources import check_local_files, load_split
from mtft.forgetting.corpus import corpus_path
from mtft.tasks.base import DatasetRef
from mtft.tasks.columns import column_values

Encode = Callable[[dict[str, torch.Tensor]], torch.Tensor]  # a padded batch -> last hidden states (n, T, d)


def mean_pooled(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(n, d): the mean of ``hidden`` (n, T, d) over the positions where ``attention_mask`` is 1."""
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)


def retrieval_accuracy(source: torch.Tensor, target: torch.Tensor) -> tuple[float, float]:
    """(source → target, target → source) accuracy of nearest-neighbour retrieval by cosine similarity between
    row-aligned sentence embeddings (row i of ``source`` translates row i of ``target``); a tie counts against."""
    if source.shape != target.shape or source.dim() != 2 or len(source) < 2:
        raise ValueError(f"need two aligned (n ≥ 2, d) embeddings, got {tuple(source.shape)}, {tuple(target.shape)}")
    a = torch.nn.functional.normalize(source.double(), dim=1)
    b = torch.nn.functional.normalize(target.double(), dim=1)
    sim = a @ b.T
    own = sim.diagonal()
    forward = (sim > own.unsqueeze(1)).sum(1) + (sim == own.unsqueeze(1)).sum(1) - 1  # rivals at least as close
    backward = (sim > own.unsqueeze(0)).sum(0) + (sim == own.unsqueeze(0)).sum(0) - 1
    return float((forward == 0).double().mean()), float((backward == 0).double().mean())


@dataclass
class Bitext:
    """Aligned sentences of one language pair (``source[i]`` translates ``target[i]``)."""

    pair: str  # "en-de"
    source: list[str]
    target: list[str]


def parse_pair(pair: str) -> tuple[str, str]:
    source, sep, target = pair.partition("-")
    if not sep or not source or not target or source == target:
        raise ConfigError(f"forgetting.retrieval.pairs: {pair!r} is not 'source-target' of two languages (e.g. en-de)")
    return source, target


def retrieval_pairs(cfg: RetrievalSection, languages: Sequence[str]) -> list[str]:
    """The configured pairs, or the first of ``languages`` (the corpus languages) with each other one."""
    if cfg.pairs is not None:
        for pair in cfg.pairs:
            parse_pair(pair)
        return list(cfg.pairs)
    if len(languages) < 2:
        raise ConfigError(
            "forgetting.retrieval: needs two languages; list forgetting.retrieval.pairs (e.g. [en-de]) or more "
            "corpus languages"
        )
    return [f"{languages[0]}-{other}" for other in languages[1:]]


def _texts(
    retrieval: RetrievalSection, corpus: CorpusSection, data: DataSection, name: str, column: str, language: str
) -> list:
    ref = DatasetRef(path=retrieval_path(retrieval, corpus), name=name, split=retrieval.split, language=language)
    dataset = load_split(ref, data.sources, data.cache_dir)
    if column not in dataset.column_names:
        raise DataError(
            f"forgetting.retrieval: {ref.describe()} has no column {column!r}; it has: "
            + ", ".join(dataset.column_names)
        )
    return column_values(dataset, column)


def retrieval_path(retrieval: RetrievalSection, corpus: CorpusSection) -> str:
    """The parallel corpus: ``forgetting.retrieval.path``, default the corpus of L_p (the built-in one: parallel)."""
    return retrieval.path if retrieval.path is not None else corpus_path(corpus)


def _ref_names(cfg: RetrievalSection, source: str, target: str) -> list[tuple[str, str, str]]:
    """(config name, column, language) of each side."""
    what = "forgetting.retrieval.name"
    if "language" in check_template(cfg.name, LANGUAGE_FIELDS | PAIR_FIELDS, what):
        return [(fill_template(cfg.name, {"language": lang}, what), cfg.text_column, lang) for lang in (source, target)]
    name = fill_template(cfg.name, {"source": source, "target": target}, what)
    return [(name, column, lang) for column, lang in zip(cfg.columns, (source, target))]


def check_bitext_files(
    retrieval: RetrievalSection, corpus: CorpusSection, data: DataSection, pairs: Sequence[str]
) -> None:
    """Before anything heavy: each local file the retrieval monitor reads exists and is UTF-8."""
    path = retrieval_path(retrieval, corpus)
    if path.startswith((os.sep, ".")) and path not in data.sources and not Path(path).exists():
        raise DataError(f"forgetting.retrieval.path: no such folder {path}")  # a local path, not a Hub id
    for pair in pairs:
        for name, _, language in _ref_names(retrieval, *parse_pair(pair)):
            ref = DatasetRef(path=path, name=name, split=retrieval.split, language=language)
            check_local_files(ref, data.sources)


def load_bitext(retrieval: RetrievalSection, corpus: CorpusSection, data: DataSection, pair: str) -> Bitext:
    """The first ``max_sentences`` aligned pairs of ``pair`` whose texts are non-empty and not repeated."""
    sides = [
        _texts(retrieval, corpus, data, name, column, lang)
        for name, column, lang in _ref_names(retrieval, *parse_pair(pair))
    ]
    if len(sides[0]) != len(sides[1]):
        raise DataError(
            f"forgetting.retrieval {pair}: the two languages have {len(sides[0])} and {len(sides[1])} rows in "
            f"split {retrieval.split!r}; a parallel corpus has row i of one translating row i of the other"
        )
    bitext = aligned(pair, *sides, retrieval.max_sentences)
    if len(bitext.source) < 2:
        raise DataError(
            f"forgetting.retrieval {pair}: fewer than 2 distinct aligned sentences in split {retrieval.split!r}"
        )
    return bitext


def aligned(pair: str, source: Sequence, target: Sequence, max_sentences: int) -> Bitext:
    """The first ``max_sentences`` aligned rows whose texts are non-empty strings, neither repeating an earlier
    one."""
    seen: tuple[set, set] = (set(), set())
    out = Bitext(pair, [], [])
    for a, b in zip(source, target):
        if not (isinstance(a, str) and isinstance(b, str) and a.strip() and b.strip()):
            continue
        if a in seen[0] or b in seen[1]:
            continue
        seen[0].add(a)
        seen[1].add(b)
        out.source.append(a)
        out.target.append(b)
        if len(out.source) == max_sentences:
            break
    return out


class RetrievalSet:
    """The bitexts of a run, tokenised once; :meth:`accuracy` embeds them with the encoder as it is now."""

    def __init__(self, bitexts: Sequence[Bitext], tokenizer, max_length: int, batch_size: int, prefix: str = ""):
        """``prefix``: written before every sentence (E5 embeds bitext as "query: " + text)."""
        self.pairs = [b.pair for b in bitexts]
        self.batch_size = batch_size
        self.batches = {
            b.pair: [
                self._batches(tokenizer, [prefix + t for t in texts], max_length) for texts in (b.source, b.target)
            ]
            for b in bitexts
        }
        self.sizes = {b.pair: len(b.source) for b in bitexts}

    def _batches(self, tokenizer, texts: list[str], max_length: int) -> list[dict[str, torch.Tensor]]:
        return [
            dict(
                tokenizer(
                    texts[i : i + self.batch_size],
                    truncation=True,
                    max_length=max_length,
                    padding=True,
                    return_tensors="pt",
                    return_token_type_ids=False,
                )
            )
            for i in range(0, len(texts), self.batch_size)
        ]

    @torch.no_grad()
    def accuracy(self, encode: Encode, device) -> dict[str, float]:
        """``retrieval/<pair>`` (both directions averaged) for each pair, and ``retrieval`` (their mean)."""
        out = {}
        for pair, sides in self.batches.items():
            embedded = []
            for batches in sides:
                parts = []
                for batch in batches:
                    batch = {k: v.to(device) for k, v in batch.items()}
                    parts.append(mean_pooled(encode(batch).float(), batch["attention_mask"]).cpu())
                embedded.append(torch.cat(parts))
            forward, backward = retrieval_accuracy(*embedded)
            out[f"retrieval/{pair}"] = (forward + backward) / 2
        out["retrieval"] = sum(out[f"retrieval/{p}"] for p in self.pairs) / len(self.pairs)
        return out


def build_retrieval_set(
    forgetting: ForgettingSection, corpus: CorpusSection, data: DataSection, tokenizer, languages: Sequence[str]
) -> RetrievalSet:
    retrieval = forgetting.retrieval
    pairs = retrieval_pairs(retrieval, languages)
    check_bitext_files(retrieval, corpus, data, pairs)
    bitexts = [load_bitext(retrieval, corpus, data, pair) for pair in pairs]
    return RetrievalSet(bitexts, tokenizer, data.max_length, forgetting.batch_size, retrieval.prefix)
