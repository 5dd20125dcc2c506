"""Task heads. A head maps the encoder's hidden states of its own rows to logits, a loss, and predictions.

The head owns three things (the task owns the data, see :mod:`mtft.tasks.base`):

* **label collation** -- :meth:`Head.collate_labels` turns the ``labels`` values of its encoded rows (a class id,
  a float, a per-token id list, a (start, end) pair, a choice index: whatever its task kind writes) into a
  ``(rows, width)`` tensor. The batch builder places every head's block into ONE ``labels`` matrix of the
  mixed batch (float64, so that class ids, token positions and regression targets are all exact; unused cells
  hold :data:`IGNORE_INDEX`), and each head reads its own rows back in :meth:`forward`.
* **the loss** -- for each of its rows, the *sum* of its loss units and their *count* (one unit per example
  for classification, one per labelled token for tagging), so that a per-objective mean is exact across rows,
  micro-batches and data-parallel ranks.
* **decoding** -- :meth:`decode` turns logits into one raw output per encoded row (a label name, per-token
  tags, start/end scores); the task then post-processes rows back to examples.

Rows holding several sequences (multiple choice) are expanded by the batch builder into one encoder row per
sequence; ``group_index`` then says which encoder rows form one example (see ``tasks/README.md``).

Each head kind is paired with the task kind that writes its labels in :mod:`mtft.tasks.kinds`, which
builds heads by kind (:func:`mtft.tasks.kinds.build_head`).
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple, Optional, Sequence

import torch
from torch import nn

from mtft.core.labels import IGNORE_INDEX
from mtft.models.multihead import MultiLinear, multi_linear


class HeadOutput(NamedTuple):
    """A head's output. A named tuple, not a dataclass: DeepSpeed ZeRO-3 attaches its backward hooks to a module's
    output tensors and finds them inside tuples, lists and dicts only (of a dataclass it warns that it cannot)."""

    logits: Any  # a tensor, or a tuple of tensors (start/end logits)
    loss_sum: torch.Tensor  # (rows,)
    loss_count: torch.Tensor  # (rows,)
    # the max-margin regulariser's inputs (mtft.models.mmr), from heads whose rows carry a class id: the
    # (rows, d) features the final linear classifier receives and the (rows,) class ids (IGNORE_INDEX: none)
    features: Optional[torch.Tensor] = None
    classes: Optional[torch.Tensor] = None


class Head(nn.Module):
    """Base class of every head. ``forward``/``logits``/``decode`` take the rows' context as keywords:

    ``attention_mask`` (rows, width) and ``group_index`` (rows,): encoder rows that share a value belong to
    one example (only multiple-choice rows share one).
    """

    kind: ClassVar[str] = ""
    # whether forward() returns HeadOutput.features/classes, so that the max-margin regulariser applies
    classifies: ClassVar[bool] = False

    def __init__(self, hidden_size: int, label_names: Sequence[str], dropout: float):
        super().__init__()
        self.label_names = list(label_names)

    @classmethod
    def collate_labels(cls, values: list) -> torch.Tensor:
        """``(rows, width)`` float64 tensor of the label values of encoded rows (lists padded with IGNORE_INDEX)."""
        vectors = [list(v) if isinstance(v, (list, tuple)) else [v] for v in values]
        width = max((len(v) for v in vectors), default=1)
        out = torch.full((len(vectors), max(width, 1)), float(IGNORE_INDEX), dtype=torch.float64)
        for i, vector in enumerate(vectors):
            if vector:
                out[i, : len(vector)] = torch.tensor(vector, dtype=torch.float64)
        return out

    def logits(self, hidden: torch.Tensor, **context: Any) -> Any:
        raise NotImplementedError

    def probabilities(self, logits: Any, **context: Any) -> list[list[float]]:
        """Per example, a probability for each of its classes (or choices) where the kind has them; none here."""
        return []

    def forward(self, hidden: torch.Tensor, labels: torch.Tensor, **context: Any) -> HeadOutput:
        raise NotImplementedError

    def decode(self, logits: Any, **context: Any) -> list:
        raise NotImplementedError


def label_matrix(labels: torch.Tensor, rows: int, width: int = 1) -> torch.Tensor:
    """The ``(rows, >= width)`` view of a head's labels; a 1-D tensor of class ids is one column.

    A batch's label matrix is as wide as its widest head's labels, so a head's block may be narrower than
    the head reads (e.g. a QA head with no rows in a batch of class ids): missing columns carry no label."""
    if labels.dim() == 1:
        labels = labels[:, None]
    if labels.dim() != 2 or labels.shape[0] != rows:
        raise ValueError(f"labels of shape {tuple(labels.shape)} for {rows} rows; expected (rows,) or (rows, width)")
    if labels.shape[1] < width:
        labels = nn.functional.pad(labels, (0, width - labels.shape[1]), value=IGNORE_INDEX)
    return labels


class PooledHead(Head):
    """RoBERTa-style pooler on the first token (dense -> tanh -> dropout) and a projection ``out_proj`` to
    :meth:`num_outputs` numbers per row: the shared trunk of the sequence-level heads.

    Subclasses define :meth:`loss` on the projected logits. With MHLoss (:meth:`use_heads`, Fu, So & Collier,
    2023, eq. 10) ``out_proj`` becomes H linear heads over the same pooled features: the training loss is the
    mean over heads of each head's loss, and :meth:`logits` (prediction) is the averaged head's.
    """

    def __init__(self, hidden_size: int, label_names: Sequence[str], dropout: float):
        super().__init__(hidden_size, label_names, dropout)
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.dropout = nn.Dropout(dropout)
        self.out_proj: nn.Module = nn.Linear(hidden_size, self.num_outputs())

    def num_outputs(self) -> int:
        return len(self.label_names)

    def use_heads(self, heads: int) -> None:
        """Train ``heads`` copies of ``out_proj`` at once (MHLoss); 1 keeps the plain head untouched. The first copy
        is the existing ``out_proj``, the others are freshly initialised from the global generator."""
        if heads > 1:
            self.out_proj = multi_linear(self.out_proj, heads)  # type: ignore[arg-type]

    def features(self, hidden: torch.Tensor) -> torch.Tensor:
        """The ``(rows, hidden_size)`` input of ``out_proj``: what the final linear classifier receives."""
        x = self.dropout(hidden[:, 0])
        return self.dropout(torch.tanh(self.dense(x)))

    def project(self, features: torch.Tensor, per_head: bool = False) -> torch.Tensor:
        """``out_proj`` of the features: (rows, outputs), or (H, rows, outputs) per head of an MHLoss head."""
        return self.out_proj(features, per_head=True) if per_head else self.out_proj(features)

    def logits(self, hidden: torch.Tensor, **context: Any) -> torch.Tensor:
        return self.project(self.features(hidden))

    def loss(self, logits: torch.Tensor, labels: torch.Tensor, **context: Any) -> HeadOutput:
        raise NotImplementedError

    def forward(self, hidden: torch.Tensor, labels: torch.Tensor, **context: Any) -> HeadOutput:
        features = self.features(hidden)
        if not isinstance(self.out_proj, MultiLinear):
            out = self.loss(self.project(features), labels, **context)
        else:
            per_head = self.project(features, per_head=True)
            outputs = [self.loss(logits, labels, **context) for logits in per_head]
            loss_sum = torch.stack([o.loss_sum for o in outputs]).mean(0)  # eq. 10: the mean over the H heads
            out = HeadOutput(per_head.mean(0), loss_sum, outputs[0].loss_count, classes=outputs[0].classes)
        if self.classifies:  # the max-margin regulariser reads the features every head of an MHLoss head shares
            out = out._replace(features=features)
        return out


class PooledScoreHead(PooledHead):
    """A :class:`PooledHead` with one number per row (a regression value, a choice's or a candidate's score)."""

    def num_outputs(self) -> int:
        return 1

    def project(self, features: torch.Tensor, per_head: bool = False) -> torch.Tensor:
        return super().project(features, per_head).squeeze(-1)


class SequenceClassificationHead(PooledHead):
    """RoBERTa-style classifier on the first token: dense -> tanh -> dropout -> projection to the labels.

    Labels: one class id per row (IGNORE_INDEX: the row carries no loss).

    Its :class:`HeadOutput` carries the features E(x) of the max-margin regulariser (Fu, So & Collier, 2023,
    eq. 8): the input of ``out_proj``, i.e. the pooled, dense+tanh features after dropout. The paper's analysis
    is of a *linear* head on top of the encoder, x̃ = [E(x)ᵀ, −1]ᵀ, and its margin is the margin of the features
    that linear classifier separates; here the linear classifier is ``out_proj``, so E is everything below it
    (encoder and the pooler ``dense``). Taking the encoder's first-token state instead would leave the pooler
    free to undo the separation the term asks for.
    """

    kind = "sequence_classification"
    classifies = True

    def probabilities(self, logits: Any, **context: Any) -> list[list[float]]:
        return logits.softmax(-1).tolist()

    def loss(self, logits: torch.Tensor, labels: torch.Tensor, **context: Any) -> HeadOutput:
        target = label_matrix(labels, logits.shape[0])[:, 0].long()
        loss = nn.functional.cross_entropy(logits, target, reduction="none", ignore_index=IGNORE_INDEX)
        return HeadOutput(logits, loss, (target != IGNORE_INDEX).to(loss.dtype), classes=target)

    def decode(self, logits: torch.Tensor, **context: Any) -> list[str]:
        return [self.label_names[i] for i in logits.argmax(-1).tolist()]
