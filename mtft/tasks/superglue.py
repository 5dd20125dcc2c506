"""SuperGLUE tasks that need code: MultiRC, ReCoRD, WiC, WSC and AX-g (the others are declarative).

* **MultiRC** -- one encoded row per answer option, (paragraph, question + answer), classified True/False. The
  example id is ``paragraph-question-answer`` (``aps/super_glue``'s question index restarts per paragraph);
  scoring groups the options by ``paragraph-question``: EM over questions, F1a over all options.
* **ReCoRD** -- one encoded row per candidate entity, (passage, query with ``@placeholder`` filled by the
  candidate), scored by the ``candidate_scoring`` head; the prediction of a query is its best-scoring
  candidate, scored with the max over its gold answers of SQuAD EM and F1.
* **WiC** -- the target word marked in both sentences by its character offsets.
* **WSC** -- the noun phrase (span 1) and the pronoun (span 2) marked in the text by their word indices;
  spans whose text differs from the words at their index are counted and reported (``wsc`` has some,
  ``wsc.fixed`` fixes most).
* **AX-g** -- accuracy and gender parity over the he/she pairs (indices 2k, 2k+1).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence

import datasets

from mtft.core.errors import DataError
from mtft.metrics.common import accuracy
from mtft.metrics.diagnostics import gender_parity
from mtft.metrics.superglue import multirc_scores, record_scores
from mtft.tasks.base import SEGMENTS, Task, unique_by_id
from mtft.tasks.columns import column_values
from mtft.tasks.hidden import HIDDEN_ENCODED, check_not_hidden, is_hidden
from mtft.tasks.spans import CharSpan, mark_char_spans, word_span

logger = logging.getLogger("mtft")

PLACEHOLDER = "@placeholder"


def _index_id(idx: Any, keys: Sequence[str]) -> str:
    """'3-1-0' from {"paragraph": 3, "question": 1, "answer": 0} (the keys in the given order)."""
    if not isinstance(idx, dict) or any(k not in idx for k in keys):
        raise DataError(f"idx {idx!r} is not a mapping with the keys {', '.join(keys)}")
    return "-".join(str(idx[k]) for k in keys)


# ----- MultiRC ------------------------------------------------------------------------------------------------
@dataclass
class MultiRCTask(Task):
    metrics: Sequence[str] = ("exact_match", "f1a")

    def available_metrics(self) -> tuple[str, ...]:
        return ("exact_match", "f1a")

    def encode(self, batch: dict[str, list], tokenizer: Any, max_length: int) -> Any:
        second = [f"{q} {a}" for q, a in zip(batch["question"], batch["answer"])]
        return tokenizer(batch["paragraph"], second, truncation=True, max_length=max_length)

    def example_ids(self, batch: dict[str, list], rows: Sequence[int]) -> list[str]:
        return [_index_id(i, ("paragraph", "question", "answer")) for i in batch[self.id_column]]

    def references(self, raw: datasets.Dataset, label_names: Sequence[str], where: str) -> dict[str, Any]:
        """Example id -> {label name, question id}: the question groups the options when scoring."""
        labels = super().references(raw, label_names, where)  # in the split's order
        questions = [_index_id(i, ("paragraph", "question")) for i in column_values(raw, self.id_column)]
        return {
            key: {"label": label, "question": question} for (key, label), question in zip(labels.items(), questions)
        }

    def compute_metrics(self, predictions: Sequence, references: Sequence) -> dict[str, float]:
        scores = multirc_scores(predictions, [r["label"] for r in references], [r["question"] for r in references])
        return {name: scores[name] for name in self.metrics}


# ----- ReCoRD -------------------------------------------------------------------------------------------------
@dataclass
class RecordTask(Task):
    head: str = "candidate_scoring"
    metrics: Sequence[str] = ("exact_match", "f1")

    def placeholder_label(self, row: Any) -> Any:
        """No label of this kind encodes without the row's own candidates: the user gives one."""
        raise DataError(
            f"task {self.name!r} ({self.head}): give its label column {self.label_column!r} too (any valid value: "
            "predictions do not read it)"
        )

    def available_metrics(self) -> tuple[str, ...]:
        return ("exact_match", "f1")

    def majority_prediction(
        self, train: Sequence[datasets.Dataset], label_names: Sequence[str], where: str
    ) -> Optional[Any]:
        return None  # an entity among each query's candidates: no majority class

    def required_columns(self) -> list[str]:
        return ["passage", "query", "entities", self.label_column, self.id_column]

    def texts(self, dataset: datasets.Dataset) -> Iterator[str]:
        yield from dataset["passage"]
        yield from dataset["query"]

    def resolve_label_names(self, dataset: datasets.Dataset) -> list[str]:
        return []  # candidates are scored, not classified

    def check_split(self, dataset: datasets.Dataset, where: str, rows: Sequence[int]) -> datasets.Dataset:
        for row, query, entities in zip(rows, dataset["query"], dataset["entities"]):
            if PLACEHOLDER not in query:
                raise DataError(f"{where}: row {row}: query has no {PLACEHOLDER}: {query!r}")
            if not entities:
                raise DataError(f"{where}: row {row}: no candidate entities")
        return dataset

    def example_ids(self, batch: dict[str, list], rows: Sequence[int]) -> list[str]:
        return [_index_id(i, ("passage", "query")) for i in batch[self.id_column]]

    def encode_rows(
        self,
        batch: dict[str, list],
        rows: list[int],
        tokenizer: Any,
        max_length: int,
        label_names: Sequence[str],
        where: str,
    ) -> dict[str, list]:
        """One encoded row per (query, candidate); label 1 for a gold answer, 0 otherwise, hidden on test."""
        passages, queries, labels, ids, candidates = [], [], [], [], []
        for passage, query, entities, answers, example in zip(
            batch["passage"],
            batch["query"],
            batch["entities"],
            batch[self.label_column],
            self.example_ids(batch, rows),
        ):
            hidden = is_hidden(self, answers)
            for entity in dict.fromkeys(entities):  # unique, in order
                passages.append(passage)
                queries.append(query.replace(PLACEHOLDER, entity))
                labels.append(HIDDEN_ENCODED if hidden else int(entity in answers))
                ids.append(example)
                candidates.append(entity)
        encoded = tokenizer(passages, queries, truncation=True, max_length=max_length)
        out = {"input_ids": encoded["input_ids"], "labels": labels, "id": ids, "candidate": candidates}
        if SEGMENTS in encoded:
            out[SEGMENTS] = encoded[SEGMENTS]
        return out

    def postprocess(
        self, outputs: list, encoded: datasets.Dataset, raw: datasets.Dataset, label_names: Sequence[str]
    ) -> dict[str, Any]:
        """The best-scoring candidate of every query (the first one on a tie)."""
        best: dict[str, tuple[float, str]] = {}
        for score, example, candidate in zip(outputs, encoded["id"], encoded["candidate"]):
            if example not in best or score > best[example][0]:
                best[example] = (score, candidate)
        return {example: candidate for example, (_, candidate) in best.items()}

    def references(self, raw: datasets.Dataset, label_names: Sequence[str], where: str) -> dict[str, Any]:
        answers = column_values(raw, self.label_column)
        check_not_hidden(self, answers, where)
        return unique_by_id(self.split_ids(raw), [list(a) for a in answers], where)

    def check_prediction(self, prediction: Any, reference: Any, label_names: Sequence[str]) -> Optional[str]:
        return None if isinstance(prediction, str) else f"prediction {prediction!r} is not an entity (a string)"

    def compute_metrics(self, predictions: Sequence, references: Sequence) -> dict[str, float]:
        scores = record_scores(predictions, references)
        return {name: scores[name] for name in self.metrics}


# ----- WiC and WSC: spans marked in the text ------------------------------------------------------------------
@dataclass
class WiCTask(Task):
    """(sentence 1, sentence 2), the target word marked with ``*`` in both by its character offsets."""

    def required_columns(self) -> list[str]:
        return [*super().required_columns(), "start1", "end1", "start2", "end2"]

    def _marked(self, batch: Any, k: int) -> list[str]:
        return [
            mark_char_spans(text, [CharSpan(s, e, "*", "*")])
            for text, s, e in zip(batch[f"sentence{k}"], batch[f"start{k}"], batch[f"end{k}"])
        ]

    def texts(self, dataset: datasets.Dataset) -> Iterator[str]:
        for k in (1, 2):  # as the model reads them, markers included (the tiny tokenizer learns them)
            yield from self._marked(dataset, k)

    def encode(self, batch: dict[str, list], tokenizer: Any, max_length: int) -> Any:
        return tokenizer(self._marked(batch, 1), self._marked(batch, 2), truncation=True, max_length=max_length)

    def check_split(self, dataset: datasets.Dataset, where: str, rows: Sequence[int]) -> datasets.Dataset:
        for k in (1, 2):
            for row, text, s, e in zip(rows, dataset[f"sentence{k}"], dataset[f"start{k}"], dataset[f"end{k}"]):
                if not 0 <= s < e <= len(text):
                    raise DataError(
                        f"{where}: row {row}: target span [{s}, {e}) lies outside sentence{k} ({len(text)} characters)"
                    )
        return dataset


@dataclass
class WSCTask(Task):
    """The text with span 1 (the noun phrase) marked ``*…*`` and span 2 (the pronoun) marked ``#…#``."""

    def required_columns(self) -> list[str]:
        return [*super().required_columns(), "span1_index", "span2_index", "span1_text", "span2_text"]

    def _spans(self, text: str, row: dict) -> tuple[list[CharSpan], bool]:
        first, ok1 = word_span(text, row["span1_index"], row["span1_text"])
        second, ok2 = word_span(text, row["span2_index"], row["span2_text"])
        return [CharSpan(first.start, first.end, "*", "*"), CharSpan(second.start, second.end, "#", "#")], ok1 and ok2

    def _marked(self, batch: Any) -> list[str]:
        texts = []
        for i, text in enumerate(batch["text"]):
            spans, _ = self._spans(
                text, {k: batch[k][i] for k in ("span1_index", "span2_index", "span1_text", "span2_text")}
            )
            texts.append(mark_char_spans(text, spans))
        return texts

    def texts(self, dataset: datasets.Dataset) -> Iterator[str]:
        yield from self._marked(dataset)  # as the model reads them, markers included

    def encode(self, batch: dict[str, list], tokenizer: Any, max_length: int) -> Any:
        return tokenizer(self._marked(batch), truncation=True, max_length=max_length)

    def check_split(self, dataset: datasets.Dataset, where: str, rows: Sequence[int]) -> datasets.Dataset:
        """Spans must lie in the text and not overlap; spans whose words differ from their text are reported."""
        differing = []
        columns = ["text", "span1_index", "span2_index", "span1_text", "span2_text"]
        for row, record in zip(rows, dataset.select_columns(columns)):
            try:
                spans, matches = self._spans(record["text"], record)
                mark_char_spans(record["text"], spans)
            except ValueError as exc:
                raise DataError(f"{where}: row {row}: {exc}") from None
            if not matches:
                differing.append(row)
        if differing:
            logger.warning(
                f"{where}: {len(differing)} row(s) whose span text differs from the words at its index "
                f"(marked by index), e.g. row {differing[0]}"
            )
        return dataset


# ----- AX-g -------------------------------------------------------------------------------------------------
@dataclass
class AXgTask(Task):
    """Entailment (evaluated with the RTE head): accuracy, and gender parity over the he/she pairs."""

    metrics: Sequence[str] = ("accuracy", "gender_parity")

    def available_metrics(self) -> tuple[str, ...]:
        return ("accuracy", "gender_parity")

    def references(self, raw: datasets.Dataset, label_names: Sequence[str], where: str) -> dict[str, Any]:
        """Example id -> {label name, idx}: the index pairs the he/she examples for gender parity."""
        labels = super().references(raw, label_names, where)  # in the split's order
        return {key: {"label": label, "idx": int(idx)} for (key, label), idx in zip(labels.items(), raw["idx"])}

    def compute_metrics(self, predictions: Sequence, references: Sequence) -> dict[str, float]:
        scores = {
            "accuracy": accuracy(predictions, [r["label"] for r in references]),
            "gender_parity": gender_parity(predictions, [r["idx"] for r in references]),
        }
        return {name: scores[name] for name in self.metrics}
