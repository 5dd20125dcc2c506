"""L_p of an encoder pre-trained contrastively (multilingual-e5): its own InfoNCE loss on parallel sentences.

Mao et al. (2022) define forgetting through the pre-training loss L_p, which for XLM-R is the masked-LM loss. E5
(Wang et al., 2022, "Text embeddings by weakly-supervised contrastive pre-training"; the multilingual models, Wang et
al., 2024) was pre-trained with the contrastive InfoNCE loss over text pairs, with in-batch negatives, temperature
τ = 0.01, mean pooling of the last hidden states, "query: " / "passage: " prefixes, and ships no masked-LM head: a
masked-LM L_p would measure a head fitted afterwards, not what pre-training optimised. Its L_p here is that loss on
held-out *parallel* sentences (the cross-lingual knowledge Mao et al. worry about): for each corpus language ℓ other
than the pivot, the pairs ("query: " + sentence i in ℓ, "passage: " + sentence i in the pivot), a fixed batch of
them at a time, each query scored against every passage of its batch::

    L_p(ℓ) = mean_i −log softmax_j( cos(q_i, p_j) / τ )_i

It is a smooth function of the weights, so λ_p (the Hessian's top eigenvalue), the Theorem-1 bounds and the Gaussian
probe apply to it as to the masked-LM loss (:mod:`mtft.forgetting.hessian` calls the same ``forward``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import nn

from mtft.config.schema import ContrastiveSection, CorpusSection, DataSection
from mtft.core.errors import ConfigError, DataError
from mtft.forgetting.corpus import corpus_texts
from mtft.forgetting.mlm import EncoderLoss
from mtft.forgetting.retrieval import mean_pooled


class ContrastiveLp(EncoderLoss):
    """``encoder`` (shared, not copied) under e5's InfoNCE. ``forward`` returns (loss sum, pairs)."""

    def __init__(self, encoder: nn.Module, temperature: float):
        super().__init__(encoder)
        self.temperature = temperature

    def forward(
        self,
        query_input_ids: torch.Tensor,
        query_attention_mask: torch.Tensor,
        passage_input_ids: torch.Tensor,
        passage_attention_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        q = mean_pooled(self.hidden(query_input_ids, query_attention_mask), query_attention_mask)
        p = mean_pooled(self.hidden(passage_input_ids, passage_attention_mask), passage_attention_mask)
        q, p = nn.functional.normalize(q.float(), dim=-1), nn.functional.normalize(p.float(), dim=-1)
        logits = q @ p.T / self.temperature
        target = torch.arange(len(q), device=logits.device)
        loss = nn.functional.cross_entropy(logits, target, reduction="sum")
        return loss, torch.tensor(len(q), device=logits.device)

    def targets(self, batch: dict[str, torch.Tensor]) -> int:
        return int(batch["query_input_ids"].shape[0])


@dataclass
class ParallelEvalSet:
    """Per language (other than the pivot), held-out (query, passage) pairs, tokenised once; ``batches`` pads them.
    The interface of :class:`~mtft.forgetting.corpus.MlmEvalSet`, for a loss whose targets are pairs."""

    pairs: dict[str, tuple[list[list[int]], list[list[int]]]]
    pad_id: int
    pivot: str

    @property
    def languages(self) -> list[str]:
        return list(self.pairs)

    def fewest_masked(self, language: str) -> int:
        """InfoNCE needs a negative: a fixed batch of fewer than 2 pairs would score nothing."""
        return 2

    def batches(self, language: str, batch_size: int, limit: Optional[int] = None) -> list[dict[str, torch.Tensor]]:
        queries, passages = (side[:limit] for side in self.pairs[language])
        starts = list(range(0, len(queries), batch_size))
        if (
            len(starts) > 1 and len(queries) - starts[-1] < 2
        ):  # a last pair alone has no negative: it joins the one before
            starts.pop()
        out = []
        for start, stop in zip(starts, [*starts[1:], len(queries)]):
            (q_ids, q_mask), (p_ids, p_mask) = self._pad(queries[start:stop]), self._pad(passages[start:stop])
            out.append(
                {
                    "query_input_ids": q_ids,
                    "query_attention_mask": q_mask,
                    "passage_input_ids": p_ids,
                    "passage_attention_mask": p_mask,
                }
            )
        return out

    def _pad(self, rows: Sequence[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r)
            mask[i, : len(r)] = 1
        return ids, mask

    def digest(self) -> str:
        h = hashlib.sha256(f"contrastive|{self.pivot}".encode())
        for language, sides in self.pairs.items():
            h.update(language.encode() + b"\0" + repr(sides).encode())
        return h.hexdigest()


def build_parallel_eval_set(
    cfg: ContrastiveSection,
    corpus: CorpusSection,
    data: DataSection,
    tokenizer,
    languages: Sequence[str],
    max_length: int,
) -> ParallelEvalSet:
    """The held-out sentences of every corpus language, row i of each a translation of row i of the pivot (the
    first corpus language unless ``cfg.pivot``); a pair whose text repeats an earlier one is dropped (it would be
    its own negative)."""
    pivot = cfg.pivot or languages[0]
    if pivot not in languages:
        raise ConfigError(
            f"forgetting.contrastive.pivot={pivot!r} is not one of the corpus languages {list(languages)}"
        )
    others = [lang for lang in languages if lang != pivot]
    if not others:
        raise ConfigError(
            "forgetting.lp=contrastive: L_p pairs each corpus language with the pivot's translations; list at least "
            f"two corpus languages (corpus.languages), not only {pivot!r}"
        )
    pivot_texts = corpus_texts(corpus, data, pivot, corpus.eval_split, corpus.max_eval_examples)
    pairs = {}
    for language in others:
        texts = corpus_texts(corpus, data, language, corpus.eval_split, corpus.max_eval_examples)
        if len(texts) != len(pivot_texts):
            raise DataError(
                f"forgetting.lp=contrastive: corpus language {language!r} has {len(texts)} held-out texts and the "
                f"pivot {pivot!r} {len(pivot_texts)}; L_p needs a parallel corpus (text i of each a translation of "
                "text i)"
            )
        kept = _distinct(texts, pivot_texts)
        if len(kept) < 2:
            raise DataError(f"forgetting.lp=contrastive: fewer than 2 distinct parallel texts of {language!r}")
        encode = lambda prefix, side: tokenizer(  # noqa: E731
            [prefix + t for t in side], truncation=True, max_length=max_length
        )["input_ids"]
        pairs[language] = (
            encode(cfg.query_prefix, [a for a, _ in kept]),
            encode(cfg.passage_prefix, [b for _, b in kept]),
        )
    return ParallelEvalSet(pairs, tokenizer.pad_token_id, pivot)


def _distinct(texts: Sequence[str], pivot: Sequence[str]) -> list[tuple[str, str]]:
    seen: tuple[set, set] = (set(), set())
    out = []
    for a, b in zip(texts, pivot):
        if a in seen[0] or b in seen[1]:
            continue
        seen[0].add(a)
        seen[1].add(b)
        out.append((a, b))
    return out


def prefix_texts(cfg: ContrastiveSection) -> list[str]:
    """The prefixes as texts of their own (what a vocabulary cut to the run's texts must keep)."""
    return [cfg.query_prefix, cfg.passage_prefix]
