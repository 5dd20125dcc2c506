"""Token classification (NER, e.g. WikiANN): word-level tags, the first sub-token of each word labelled.

Rows hold a list of words (``text_columns: [tokens]``) and one tag per word (``label_column``, a
Sequence(ClassLabel) on the Hub). Encoded rows carry, per token position, the word's label id on its first
sub-token and IGNORE_INDEX elsewhere, and ``word_ids`` (-1 for special tokens) so that predictions map back to
words. Words cut off by ``max_length`` get no prediction from the model: they are predicted ``O`` (and counted
in the log), so every prediction covers every word and scores the same offline.

Metric: seqeval entity-level micro precision/recall/F1 over word-level IOB2 tags; the mode is a setting
(``default``: CoNLL chunking, what XTREME and ``evaluate``'s seqeval report; ``strict``: IOB2 strict).
"""

from __future__ import annotations

import logging
from typing import Any, Literal, Optional, Sequence

import datasets
from pydantic import BaseModel, ConfigDict, Field

from mtft.core.errors import DataError
from mtft.core.labels import IGNORE_INDEX
from mtft.tasks.base import SEGMENTS, Task, unique_by_id
from mtft.tasks.columns import column_values

logger = logging.getLogger("mtft")


class TokenClassificationSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seqeval_mode: Literal["default", "strict"] = Field(
        "default", description="seqeval chunking: default (CoNLL, as XTREME reports) or strict IOB2"
    )


class TokenClassificationTask(Task):
    Settings = TokenClassificationSettings
    text_value = "words"

    def available_metrics(self) -> tuple[str, ...]:
        return ("f1", "precision", "recall")

    def majority_prediction(
        self, train: Sequence[datasets.Dataset], label_names: Sequence[str], where: str
    ) -> Optional[Any]:
        return None  # a tag per word: no majority class

    def encode_rows(self, batch, rows, tokenizer, max_length, label_names, where) -> dict[str, list]:
        words = batch[self.text_columns[0]]
        encoded = tokenizer(words, is_split_into_words=True, truncation=True, max_length=max_length)
        out: dict[str, list] = {"input_ids": encoded["input_ids"], "labels": [], "word_ids": []}
        if SEGMENTS in encoded:
            out[SEGMENTS] = encoded[SEGMENTS]
        for n, (row, tags) in enumerate(zip(rows, batch[self.label_column])):
            if len(tags) != len(words[n]):
                raise DataError(f"{where}: row {row}: {len(words[n])} words but {len(tags)} tags")
            ids = self.label_ids(list(tags), label_names, where, [row] * len(tags))
            word_ids = encoded.word_ids(n)
            labels, previous = [], None
            for word in word_ids:
                labels.append(ids[word] if word is not None and word != previous else IGNORE_INDEX)
                previous = word
            out["labels"].append(labels)
            out["word_ids"].append([-1 if w is None else w for w in word_ids])
        out["id"] = self.example_ids(batch, rows)
        return out

    def placeholder_label(self, row: Any) -> Any:
        return [0] * len(row[self.text_columns[0]])

    def prediction_rows(self, outputs, encoded, raw, label_names) -> dict[str, dict[str, Any]]:
        """The tags of every word and the entity spans they make."""
        words = dict(zip(self.split_ids(raw), raw[self.text_columns[0]]))
        tags = self.postprocess(outputs, encoded, raw, label_names)
        return {key: {"prediction": value, "entities": entities(value, words[key])} for key, value in tags.items()}

    def postprocess(self, outputs, encoded, raw, label_names) -> dict[str, Any]:
        """Per example, the tag of each word: the prediction at the word's first sub-token."""
        outside = "O" if "O" in label_names else label_names[0]
        lengths = dict(zip(self.split_ids(raw), (len(w) for w in raw[self.text_columns[0]])))
        predictions: dict[str, Any] = {}
        unpredicted = 0
        for key, token_tags, word_ids in zip(encoded["id"], outputs, encoded["word_ids"]):
            tags: list[Optional[str]] = [None] * lengths[key]
            for tag, word in zip(token_tags, word_ids):
                if word >= 0 and tags[word] is None:
                    tags[word] = tag
            unpredicted += sum(t is None for t in tags)
            predictions[key] = [outside if t is None else t for t in tags]
        if unpredicted:
            logger.warning(
                f"task {self.name!r}: {unpredicted} word(s) beyond max_length (or with no sub-token) "
                f"predicted {outside!r}"
            )
        return predictions

    def references(self, raw: datasets.Dataset, label_names: Sequence[str], where: str) -> dict[str, Any]:
        tags = [
            [label_names[i] for i in self.label_ids(list(t), label_names, where, [r] * len(t))]
            for r, t in enumerate(column_values(raw, self.label_column))
        ]
        return unique_by_id(self.split_ids(raw), tags, where)

    def check_prediction(self, prediction, reference, label_names) -> Optional[str]:
        if not isinstance(prediction, list) or not all(isinstance(t, str) for t in prediction):
            return f"prediction must be a list of tags (one per word), got {type(prediction).__name__}"
        if len(prediction) != len(reference):
            return f"{len(prediction)} tags for {len(reference)} words"
        bad = [t for t in prediction if t not in label_names]
        if bad:
            return f"tag {bad[0]!r} is not a label name; valid: {', '.join(label_names)}"
        return None

    def compute_metrics(self, predictions: Sequence, references: Sequence) -> dict[str, float]:
        from mtft.metrics.seqeval_metrics import entity_f1

        scores = entity_f1(predictions, references, mode=self.options.seqeval_mode)
        return {name: scores[name] for name in self.metrics}

    def metric_description(self) -> str:
        mode = self.options.seqeval_mode
        detail = "CoNLL chunking, as XTREME reports" if mode == "default" else "IOB2 scheme"
        return (
            f"seqeval entity-level micro {'/'.join(self.metrics)}, word level (first sub-token labelled), "
            f"{mode} mode ({detail})"
        )


def entities(tags: Sequence[str], words: Sequence[str]) -> list[dict[str, Any]]:
    """The entity spans of a BIO tag sequence (word positions, end exclusive): ``B-X`` opens one, ``I-X`` of the
    same type continues it (an ``I-X`` after anything else opens one too, as seqeval's default mode reads it)."""
    spans: list[dict[str, Any]] = []
    for n, tag in enumerate(tags):
        prefix, _, kind = tag.partition("-")
        if prefix == "I" and spans and spans[-1]["type"] == kind and spans[-1]["end"] == n:
            spans[-1]["end"] = n + 1
        elif prefix in ("B", "I") and kind:
            spans.append({"type": kind, "start": n, "end": n + 1})
    for span in spans:
        span["text"] = " ".join(words[span["start"] : span["end"]])
    return spans
