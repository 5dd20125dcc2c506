"""Extractive question answering in the SQuAD format (TyDiQA-GoldP): windows, n-best spans, SQuAD v1.1 EM/F1.

Rows hold ``question`` and ``context`` (``text_columns: [question, context]``) and ``answers`` =
``{text: [...], answer_start: [...]}`` with character offsets into the context (``label_column``).

* **Checked offsets.** Before encoding, every gold answer must satisfy
  ``context[start:start + len(text)] == text``. Rows that do not are counted and reported (file, rows, ids);
  they are dropped with a warning (``offset_mismatch: drop``) or stop the run (``fail``); a split where every
  row mismatches always stops it. Nothing mismatched is silently kept.
* **Windows.** A long context becomes several encoded rows ("windows") of at most ``max_length`` tokens that
  overlap by ``doc_stride`` tokens, as in the Hugging Face QA recipe (the tokenizer's overflowing tokens).
  A window's label is the (start, end) token span of the first gold answer, or (0, 0) -- CLS -- when the
  window does not hold the whole answer.
* **Decoding.** Per example, over all its windows, the ``n_best_size`` best start and end positions inside
  the context form candidate spans of at most ``max_answer_length`` tokens, scored start + end; the best
  span is mapped back to the context text through the tokenizer's character offsets.
"""

from __future__ import annotations

import heapq
import logging
from typing import Any, Literal, Optional, Sequence

import datasets
from pydantic import BaseModel, ConfigDict, Field

from mtft.core.errors import ConfigError, DataError
from mtft.tasks.base import SEGMENTS, Task, unique_by_id
from mtft.tasks.columns import column_values

logger = logging.getLogger("mtft")

NOT_CONTEXT = [-1, -1]  # offset of a token outside the context (question, special tokens)


class ExtractiveQASettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    doc_stride: int = Field(128, ge=1, description="tokens shared by consecutive windows of a long context")
    max_answer_length: int = Field(30, ge=1, description="longest answer span considered, in tokens")
    n_best_size: int = Field(20, ge=1, description="start and end candidates per window")
    max_question_tokens: int = Field(64, ge=1, description="questions are cut to this many tokens")
    offset_mismatch: Literal["drop", "fail"] = Field(
        "drop", description="rows whose answer offsets do not match the context: drop and report, or fail"
    )


class ExtractiveQATask(Task):
    Settings = ExtractiveQASettings

    @property
    def question_column(self) -> str:
        return self.text_columns[0]

    @property
    def context_column(self) -> str:
        return self.text_columns[1]

    def available_metrics(self) -> tuple[str, ...]:
        return ("exact_match", "f1")

    def majority_prediction(
        self, train: Sequence[datasets.Dataset], label_names: Sequence[str], where: str
    ) -> Optional[Any]:
        return None  # a span of each context: no majority class

    def resolve_label_names(self, dataset: datasets.Dataset) -> list[str]:
        return []  # spans, not classes

    # ----- checks ------------------------------------------------------------------------------------
    def check_split(self, dataset: datasets.Dataset, where: str, rows: Sequence[int]) -> datasets.Dataset:
        if len(self.text_columns) != 2:
            raise ConfigError(f"task {self.name!r}: text_columns must be [question, context]")
        ids = self.split_ids(dataset)
        bad: list[tuple[int, str]] = []  # (position in dataset, problem)
        for n, (context, answers) in enumerate(
            zip(column_values(dataset, self.context_column), column_values(dataset, self.label_column))
        ):
            problem = answer_problem(context, answers)
            if problem:
                bad.append((n, problem))
        if not bad:
            return dataset
        first, first_problem = bad[0]
        listing = ", ".join(f"{rows[n]} (id {ids[n]})" for n, _ in bad[:5]) + (" ..." if len(bad) > 5 else "")
        summary = (
            f"{where}: task {self.name!r}: {len(bad)} of {len(dataset)} row(s) have answers that do not "
            f"match their context: rows {listing}; row {rows[first]}: {first_problem}"
        )
        if self.options.offset_mismatch == "fail" or len(bad) == len(dataset):
            raise DataError(summary)
        logger.warning(summary + "; these rows are dropped (settings.offset_mismatch=fail stops instead)")
        dropped = {n for n, _ in bad}
        return dataset.select([i for i in range(len(dataset)) if i not in dropped])

    # ----- encoding ----------------------------------------------------------------------------------
    def encode_rows(self, batch, rows, tokenizer, max_length, label_names, where) -> dict[str, list]:
        opts = self.options
        specials = tokenizer.num_special_tokens_to_add(pair=True)
        room = max_length - specials - opts.max_question_tokens
        if opts.doc_stride >= room:
            raise ConfigError(
                f"task {self.name!r}: settings.doc_stride={opts.doc_stride} must be below max_length "
                f"({max_length}) - max_question_tokens ({opts.max_question_tokens}) - special tokens ({specials})"
            )
        questions = [_cut(q.strip(), tokenizer, opts.max_question_tokens) for q in batch[self.question_column]]
        encoded = tokenizer(
            questions,
            batch[self.context_column],
            truncation="only_second",
            max_length=max_length,
            stride=opts.doc_stride,
            return_overflowing_tokens=True,
            return_offsets_mapping=True,
        )
        ids = self.example_ids(batch, rows)
        out: dict[str, list] = {"input_ids": encoded["input_ids"], "labels": [], "offset_mapping": [], "id": []}
        if SEGMENTS in encoded:
            out[SEGMENTS] = encoded[SEGMENTS]
        for i, sample in enumerate(encoded["overflow_to_sample_mapping"]):
            sequence_ids = encoded.sequence_ids(i)
            offsets = [list(o) if s == 1 else NOT_CONTEXT for o, s in zip(encoded["offset_mapping"][i], sequence_ids)]
            out["offset_mapping"].append(offsets)
            out["labels"].append(answer_span(offsets, batch[self.label_column][sample]))
            out["id"].append(ids[sample])
        return out

    # ----- predictions -------------------------------------------------------------------------------
    def postprocess(self, outputs, encoded, raw, label_names) -> dict[str, Any]:
        return self.answers(outputs, encoded, raw)[0]

    def prediction_rows(self, outputs, encoded, raw, label_names) -> dict[str, dict[str, Any]]:
        """The answer text and its character offsets in its context, end exclusive (null: the empty answer)."""
        answers, spans = self.answers(outputs, encoded, raw)
        # an empty answer has no offsets, wherever its span would lie (a whitespace-only context's best span is a
        # run of spaces, which the answer text strips)
        placed = {key: spans[key] if text and spans[key] else (None, None) for key, text in answers.items()}
        return {
            key: {"prediction": text, "answer_start": placed[key][0], "answer_end": placed[key][1]}
            for key, text in answers.items()
        }

    def placeholder_label(self, row: Any) -> Any:
        """The context's first character (an empty answer has no token span)."""
        return {"text": [row[self.text_columns[-1]][:1]], "answer_start": [0]}

    def answers(self, outputs, encoded, raw) -> tuple[dict[str, str], dict[str, Optional[tuple[int, int]]]]:
        """Per example, its predicted answer text and that answer's character span ``(start, end)`` in its context:
        the best-scoring span over its windows, without surrounding whitespace (some tokenizers' offsets include the
        space before a word); the empty answer and ``None`` where no window holds a valid span (as the HF recipe)."""
        contexts = dict(zip(self.split_ids(raw), column_values(raw, self.context_column)))
        spans = self._spans(outputs, encoded, contexts)
        return {key: contexts[key][span[0] : span[1]] if span else "" for key, span in spans.items()}, spans

    def _spans(self, outputs, encoded, contexts: dict[str, str]) -> dict[str, Optional[tuple[int, int]]]:
        opts = self.options
        best: dict[str, tuple[float, int, int]] = {}
        for key, (starts, ends), offsets in zip(encoded["id"], outputs, encoded["offset_mapping"]):
            for score, start, end in best_spans(starts, ends, offsets, opts.n_best_size, opts.max_answer_length):
                if key not in best or score > best[key][0]:
                    best[key] = (score, offsets[start][0], offsets[end][1])
                break  # spans come best first
        spans: dict[str, Optional[tuple[int, int]]] = {}
        for key in dict.fromkeys(encoded["id"]):
            if key not in best:
                spans[key] = None
                continue
            _, start, end = best[key]
            text = contexts[key][start:end]
            start += len(text) - len(text.lstrip())
            spans[key] = (start, max(start, end - (len(text) - len(text.rstrip()))))
        return spans

    def references(self, raw: datasets.Dataset, label_names: Sequence[str], where: str) -> dict[str, Any]:
        return unique_by_id(
            self.split_ids(raw), [list(a["text"]) for a in column_values(raw, self.label_column)], where
        )

    def check_prediction(self, prediction, reference, label_names) -> Optional[str]:
        if not isinstance(prediction, str):
            return f"prediction must be the answer text (a string), got {type(prediction).__name__}"
        return None

    def compute_metrics(self, predictions: Sequence, references: Sequence) -> dict[str, float]:
        from mtft.metrics.squad import squad_scores

        scores = squad_scores(predictions, references)
        return {name: scores[name] for name in self.metrics}

    def metric_description(self) -> str:
        return "SQuAD v1.1 exact match / token F1 (official normalisation, max over gold answers)"


def answer_problem(context: str, answers: dict) -> Optional[str]:
    """Why the gold answers of a row do not fit its context; None when they do."""
    texts, starts = answers.get("text") or [], answers.get("answer_start") or []
    if not texts:
        return "no gold answer"
    if len(texts) != len(starts):
        return f"{len(texts)} answer texts but {len(starts)} answer_start values"
    for text, start in zip(texts, starts):
        if not isinstance(start, int) or start < 0 or context[start : start + len(text)] != text:
            found = context[start : start + len(text)] if isinstance(start, int) and start >= 0 else None
            return f"answer {text!r} at {start} reads {found!r} in the context"
    return None


def answer_span(offsets: list[list[int]], answers: dict) -> list[int]:
    """Token (start, end) of the first gold answer inside one window; (0, 0) -- CLS -- when it is not inside."""
    start_char = answers["answer_start"][0]
    end_char = start_char + len(answers["text"][0])
    context = [i for i, o in enumerate(offsets) if o != NOT_CONTEXT]
    if not context or offsets[context[0]][0] > start_char or offsets[context[-1]][1] < end_char:
        return [0, 0]
    start = next(i for i in context if offsets[i][1] > start_char)
    end = next(i for i in reversed(context) if offsets[i][0] < end_char)
    return [start, end]


def best_spans(
    starts: Sequence[float], ends: Sequence[float], offsets: list[list[int]], n_best: int, max_answer_length: int
) -> list[tuple[float, int, int]]:
    """Valid (score, start, end) spans of one window, best first: both ends in the context, start <= end,
    at most ``max_answer_length`` tokens; candidates are the ``n_best`` best starts and ends."""
    top_starts = heapq.nlargest(n_best, range(len(starts)), key=starts.__getitem__)
    top_ends = heapq.nlargest(n_best, range(len(ends)), key=ends.__getitem__)
    spans = [
        (starts[s] + ends[e], s, e)
        for s in top_starts
        for e in top_ends
        if offsets[s] != NOT_CONTEXT and offsets[e] != NOT_CONTEXT and s <= e < s + max_answer_length
    ]
    return sorted(spans, key=lambda span: (-span[0], span[1], span[2]))


def _cut(question: str, tokenizer: Any, max_tokens: int) -> str:
    """The question cut after ``max_tokens`` tokens (at a character offset), so the context always fits."""
    encoded = tokenizer(question, add_special_tokens=False, return_offsets_mapping=True)
    if len(encoded["input_ids"]) <= max_tokens:
        return question
    return question[: encoded["offset_mapping"][max_tokens - 1][1]]
