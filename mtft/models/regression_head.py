"""A regression head (GLUE STS-B): one number per row, mean squared error, the prediction is that number."""

from __future__ import annotations

from typing import Any

import torch

from mtft.core.labels import IGNORE_INDEX
from mtft.models.heads import HeadOutput, PooledScoreHead, label_matrix


class RegressionHead(PooledScoreHead):
    """RoBERTa-style pooler on the first token (dense -> tanh -> dropout) and a projection to one number.

    Labels: one float per row (IGNORE_INDEX: the row carries no loss). The loss unit is one example, so an
    objective's loss is the mean squared error over its examples, as ``RobertaForSequenceClassification``
    computes it with ``num_labels=1``.
    """

    kind = "regression"

    def loss(self, scores: torch.Tensor, labels: torch.Tensor, **context: Any) -> HeadOutput:
        target = label_matrix(labels, scores.shape[0])[:, 0]
        labelled = target != IGNORE_INDEX
        error = (scores - target.to(scores.dtype)) ** 2
        loss = torch.where(labelled, error, torch.zeros_like(error))
        return HeadOutput(scores, loss, labelled.to(loss.dtype))

    def decode(self, logits: torch.Tensor, **context: Any) -> list[float]:
        return [float(x) for x in logits.reshape(-1).tolist()]
