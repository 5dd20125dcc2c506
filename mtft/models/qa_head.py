"""Extractive question answering: start and end scores for every token of a (question, context window) row."""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from mtft.core.labels import IGNORE_INDEX
from mtft.models.heads import Head, HeadOutput, label_matrix


class QuestionAnsweringHead(Head):
    """One projection to (start, end) per token, as Hugging Face's ``*ForQuestionAnswering``.

    Labels: per encoded row, ``[start, end]`` token positions of the answer inside the row's window; a window
    that does not hold the whole answer points at position 0 (CLS), as in the HF QA recipe. The row's loss is
    (CE(start) + CE(end)) / 2 and counts one unit. Padding positions are masked out of the softmax.
    """

    kind = "question_answering"

    def __init__(self, hidden_size: int, label_names: Sequence[str], dropout: float):
        super().__init__(hidden_size, label_names, dropout)
        self.dropout = nn.Dropout(dropout)
        self.qa_outputs = nn.Linear(hidden_size, 2)

    def logits(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None, **context: Any):
        scores = self.qa_outputs(self.dropout(hidden))  # (rows, width, 2)
        if attention_mask is not None:
            scores = scores.masked_fill((attention_mask == 0)[..., None], torch.finfo(scores.dtype).min)
        return scores

    def forward(self, hidden: torch.Tensor, labels: torch.Tensor, **context: Any) -> HeadOutput:
        scores = self.logits(hidden, **context)
        target = label_matrix(labels, hidden.shape[0], width=2)[:, :2].long()
        start = nn.functional.cross_entropy(scores[..., 0], target[:, 0], reduction="none", ignore_index=IGNORE_INDEX)
        end = nn.functional.cross_entropy(scores[..., 1], target[:, 1], reduction="none", ignore_index=IGNORE_INDEX)
        return HeadOutput(scores, (start + end) / 2, (target[:, 0] != IGNORE_INDEX).to(start.dtype))

    def decode(self, logits: torch.Tensor, attention_mask: torch.Tensor | None = None, **context: Any) -> list:
        """Per row, ``(start_scores, end_scores)`` over its unpadded positions (float lists)."""
        lengths = attention_mask.sum(1).tolist() if attention_mask is not None else [logits.shape[1]] * len(logits)
        scores = logits.float()
        return [(scores[i, :n, 0].tolist(), scores[i, :n, 1].tolist()) for i, n in enumerate(lengths)]
