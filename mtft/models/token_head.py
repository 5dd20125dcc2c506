"""Token classification (NER): one label per token; only labelled tokens (first sub-token of a word) count."""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from mtft.core.labels import IGNORE_INDEX
from mtft.models.heads import Head, HeadOutput, label_matrix


class TokenClassificationHead(Head):
    """dropout -> projection on every token, as Hugging Face's ``*ForTokenClassification``.

    Labels: per encoded row, one class id per token position, IGNORE_INDEX where a token carries no label
    (special tokens, padding, every sub-token but a word's first). A row's loss is the sum over its labelled
    tokens and its count the number of labelled tokens, so the objective's mean is per token, as in HF.
    """

    kind = "token_classification"

    def __init__(self, hidden_size: int, label_names: Sequence[str], dropout: float):
        super().__init__(hidden_size, label_names, dropout)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(hidden_size, len(self.label_names))

    def logits(self, hidden: torch.Tensor, **context: Any) -> torch.Tensor:
        return self.classifier(self.dropout(hidden))

    def forward(self, hidden: torch.Tensor, labels: torch.Tensor, **context: Any) -> HeadOutput:
        logits = self.logits(hidden)
        rows, width = hidden.shape[:2]
        target = label_matrix(labels, rows, width=width)[:, :width].long()
        loss = nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="none", ignore_index=IGNORE_INDEX
        ).reshape(rows, width)
        return HeadOutput(logits, loss.sum(1), (target != IGNORE_INDEX).sum(1).to(loss.dtype))

    def decode(self, logits: torch.Tensor, attention_mask: torch.Tensor | None = None, **context: Any) -> list:
        """Per row, the predicted label name of every (unpadded) token position."""
        best = logits.argmax(-1).tolist()
        lengths = attention_mask.sum(1).tolist() if attention_mask is not None else [len(b) for b in best]
        return [[self.label_names[i] for i in row[:n]] for row, n in zip(best, lengths)]
