"""Task heads. Each head maps the encoder's hidden states of its own rows to logits and per-example losses.

A head returns, for each of its rows, the *sum* of its loss units and their *count* (one unit per example
for classification, one per labelled token for tagging), so that a per-objective mean can be formed exactly
across rows, micro-batches and data-parallel ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn


@dataclass
class HeadOutput:
    logits: torch.Tensor
    loss_sum: torch.Tensor  # (rows,)
    loss_count: torch.Tensor  # (rows,)


class SequenceClassificationHead(nn.Module):
    """RoBERTa-style classifier on the first token: dense -> tanh -> dropout -> projection."""

    kind = "sequence_classification"

    def __init__(self, hidden_size: int, label_names: Sequence[str], dropout: float):
        super().__init__()
        self.label_names = list(label_names)
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.dropout = nn.Dropout(dropout)
        self.out_proj = nn.Linear(hidden_size, len(self.label_names))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        x = self.dropout(hidden[:, 0])
        x = self.dropout(torch.tanh(self.dense(x)))
        return self.out_proj(x)

    def forward(self, hidden: torch.Tensor, labels: torch.Tensor) -> HeadOutput:
        logits = self.logits(hidden)
        loss = nn.functional.cross_entropy(logits, labels, reduction="none")
        return HeadOutput(logits, loss, torch.ones_like(loss))

    def decode(self, logits: torch.Tensor) -> list[str]:
        return [self.label_names[i] for i in logits.argmax(-1).tolist()]


HEADS: dict[str, type[nn.Module]] = {SequenceClassificationHead.kind: SequenceClassificationHead}


def build_head(kind: str, hidden_size: int, label_names: Sequence[str], dropout: float) -> nn.Module:
    return HEADS[kind](hidden_size, label_names, dropout)
