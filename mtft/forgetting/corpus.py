"""The generic-text corpus of L_p: loading per language, fixed masks for evaluation, packed blocks for pre-training.

L_p must give the same number for the same weights every time, so the held-out texts are masked once, with
``transformers.DataCollatorForLanguageModeling`` (BERT's 80/10/10 scheme) under a seed of their own per
language, and kept as tensors; evaluation never draws random numbers (and never touches the global RNG, so a
run's training trajectory is the same with and without monitors).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import torch
from transformers import DataCollatorForLanguageModeling

from mtft.config.schema import CorpusSection, DataSection
from mtft.core.errors import ConfigError, DataError
from mtft.core.labels import IGNORE_INDEX
from mtft.core.templates import fill_template
from mtft.data.sources import check_local_files, load_split
from mtft.fixtures import GENERIC_TEXT
from mtft.tasks.base import DatasetRef
from mtft.tasks.columns import column_values


def corpus_path(corpus: CorpusSection) -> str:
    return corpus.path if corpus.path is not None else str(GENERIC_TEXT)


def corpus_name(corpus: CorpusSection, language: str) -> str:
    """The dataset config of ``language``: ``corpus.name`` with ``{language}`` filled in."""
    return fill_template(corpus.name, {"language": language}, "corpus.name")


def check_corpus_files(corpus: CorpusSection, data: DataSection, languages: Sequence[str], pretraining: bool) -> None:
    """Before anything heavy: every local corpus file the run will read (each language's held-out split, and its
    training split when it pre-trains) exists and is UTF-8 (one DataError naming the file)."""
    path = corpus_path(corpus)
    if path.startswith((os.sep, ".")) and path not in data.sources and not Path(path).exists():
        raise DataError(f"corpus.path: no such folder {path}")  # a local path, not a Hub id: say so now
    splits = [corpus.eval_split.split("[")[0]] + ([corpus.train_split.split("[")[0]] if pretraining else [])
    for language in languages:
        for split in dict.fromkeys(splits):
            name = corpus_name(corpus, language)
            ref = DatasetRef(path=corpus_path(corpus), name=name, split=split, language=language)
            check_local_files(ref, data.sources)


def corpus_texts(
    corpus: CorpusSection, data: DataSection, language: str, split: str, limit: Optional[int] = None
) -> list[str]:
    """The non-empty texts of one language's split, through the same ``load_split`` as task data."""
    ref = DatasetRef(path=corpus_path(corpus), name=corpus_name(corpus, language), split=split, language=language)
    dataset = load_split(ref, data.sources, data.cache_dir)
    if corpus.text_column not in dataset.column_names:
        raise DataError(
            f"corpus {ref.describe()}: no column {corpus.text_column!r} (corpus.text_column); it has: "
            f"{', '.join(dataset.column_names)}"
        )
    texts = [t for t in column_values(dataset, corpus.text_column) if isinstance(t, str) and t.strip()]
    if not texts:
        raise DataError(f"corpus {ref.describe()}: no non-empty texts in column {corpus.text_column!r}")
    return texts[:limit] if limit is not None else texts


def corpus_languages(corpus: CorpusSection, task_languages: Sequence[str] = ()) -> list[str]:
    languages = corpus.languages or list(dict.fromkeys(task_languages))
    if not languages:
        raise ConfigError("corpus.languages: no languages to measure L_p on; list them")
    return list(languages)


def masking_collator(tokenizer, probability: float, seed: Optional[int] = None) -> DataCollatorForLanguageModeling:
    if tokenizer.mask_token_id is None:
        raise ConfigError("the backbone's tokenizer has no mask token; L_p and pre-training need a masked-LM")
    return DataCollatorForLanguageModeling(
        tokenizer, mlm=True, mlm_probability=probability, seed=seed, return_tensors="pt"
    )


@dataclass
class MaskedExample:
    input_ids: list[int]
    labels: list[int]  # IGNORE_INDEX where the token is not a prediction target


@dataclass
class MlmEvalSet:
    """Held-out texts per language, masked once; ``batches`` pads them for the model."""

    examples: dict[str, list[MaskedExample]]
    pad_id: int

    @property
    def languages(self) -> list[str]:
        return list(self.examples)

    def fewest_masked(self, language: str) -> int:
        """The fewest leading texts of ``language`` that hold a masked token (:func:`build_eval_set` makes sure
        that all of them do): a fixed batch of fewer has no prediction target, and its mean loss is 0/0."""
        rows = self.examples[language]
        return next((i + 1 for i, r in enumerate(rows) if any(x != IGNORE_INDEX for x in r.labels)), len(rows) + 1)

    def batches(self, language: str, batch_size: int, limit: Optional[int] = None) -> list[dict[str, torch.Tensor]]:
        rows = self.examples[language][:limit]
        return [self.pad(rows[i : i + batch_size]) for i in range(0, len(rows), batch_size)]

    def pad(self, rows: list[MaskedExample]) -> dict[str, torch.Tensor]:
        width = max(len(r.input_ids) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r.input_ids)] = torch.tensor(r.input_ids)
            labels[i, : len(r.labels)] = torch.tensor(r.labels)
            mask[i, : len(r.input_ids)] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}

    def digest(self) -> str:
        h = hashlib.sha256()
        for language, rows in self.examples.items():
            h.update(language.encode() + b"\0")
            for r in rows:
                h.update(repr((r.input_ids, r.labels)).encode())
        return h.hexdigest()


def build_eval_set(
    corpus: CorpusSection, data: DataSection, tokenizer, languages: Sequence[str], max_length: int
) -> MlmEvalSet:
    """Load, tokenise and mask (once, seeded per language) the held-out texts of every language."""
    examples: dict[str, list[MaskedExample]] = {}
    for language in languages:
        texts = corpus_texts(corpus, data, language, corpus.eval_split, corpus.max_eval_examples)
        encoded = tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]
        seed = int(hashlib.sha256(f"{corpus.mask_seed}|{language}".encode()).hexdigest()[:8], 16)
        collator = masking_collator(tokenizer, corpus.mlm_probability, seed)
        batch = collator([{"input_ids": ids} for ids in encoded])
        rows = []
        for ids, masked, labels in zip(encoded, batch["input_ids"], batch["labels"]):
            rows.append(MaskedExample(masked[: len(ids)].tolist(), labels[: len(ids)].tolist()))
        if not any(label != IGNORE_INDEX for r in rows for label in r.labels):
            raise DataError(
                f"corpus language {language!r}: no token was masked in {len(rows)} texts; "
                "raise corpus.max_eval_examples or corpus.mlm_probability"
            )
        examples[language] = rows
    return MlmEvalSet(examples, tokenizer.pad_token_id)


def packed_blocks(tokenizer, texts: Sequence[str], block_size: int) -> list[list[int]]:
    """Texts (each with its special tokens) concatenated and cut into blocks of ``block_size`` tokens, as
    transformers' ``run_mlm.py`` groups texts; the incomplete last block is dropped."""
    stream: list[int] = []
    for ids in tokenizer(list(texts))["input_ids"]:
        stream.extend(ids)
    return [stream[i : i + block_size] for i in range(0, len(stream) - block_size + 1, block_size)]
