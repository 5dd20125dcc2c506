"""A multiple-choice head (SuperGLUE COPA): score every (context, choice) sequence, softmax over an example's choices.

An encoded row of a multiple-choice task holds C sequences; the batch builder turns it into C encoder rows that
share one ``group_index`` value (and the row's label: the index of the right choice). The head scores each
encoder row with one number and normalises the scores over the rows of a group, as
``RobertaForMultipleChoice`` does over its ``num_choices`` axis -- but groups may have different sizes here, so
several multiple-choice tasks (or examples with 3 and 5 choices) mix in one batch.

Loss and decoding are per example: a group's cross-entropy is booked on its first encoder row (count 1) and its
other rows carry 0 (count 0), so the per-objective mean is over examples.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mtft.core.labels import IGNORE_INDEX
from mtft.models.heads import HeadOutput, PooledScoreHead, label_matrix


def choice_layout(group_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(group number 0..G-1 of every row, position of every row within its group, G).

    Rows of one group must be contiguous (the batch builder writes an example's choices one after another);
    groups are numbered in order of appearance.
    """
    rows = group_index.shape[0]
    if rows == 0:
        empty = torch.zeros(0, dtype=torch.long, device=group_index.device)
        return empty, empty, 0
    starts = torch.ones(rows, dtype=torch.bool, device=group_index.device)
    starts[1:] = group_index[1:] != group_index[:-1]
    group = torch.cumsum(starts.long(), 0) - 1
    count = int(group[-1]) + 1
    if torch.unique(group_index).numel() != count:
        raise ValueError("the rows of a multiple-choice example must be contiguous in the batch")
    first_row = torch.nonzero(starts, as_tuple=True)[0]
    position = torch.arange(rows, device=group_index.device) - first_row[group]
    return group, position, count


class MultipleChoiceHead(PooledScoreHead):
    """Pooler on the first token (dense -> tanh -> dropout) and one score per (context, choice) sequence; the
    softmax over an example's choices happens in the loss and in decoding.

    ``label_names`` name the choices by position (COPA's ClassLabel: ``choice1``, ``choice2``); the prediction of
    an example is the name of its best-scoring choice.
    """

    kind = "multiple_choice"

    def probabilities(self, logits: Any, **context: Any) -> list[list[float]]:
        """Per question, the softmax over its choices."""
        return self.choice_matrix(logits, context["group_index"]).softmax(-1).tolist()

    def choice_matrix(self, scores: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
        """``(groups, max choices)`` scores, -inf where a group has fewer choices."""
        group, position, count = choice_layout(group_index)
        width = int(position.max()) + 1 if count else 1
        matrix = scores.new_full((count, width), float("-inf"))
        return matrix.index_put((group, position), scores)

    def loss(self, scores: torch.Tensor, labels: torch.Tensor, **context: Any) -> HeadOutput:
        group_index = context["group_index"]
        group, position, count = choice_layout(group_index)
        matrix = self.choice_matrix(scores, group_index)
        target = label_matrix(labels, scores.shape[0])[:, 0].long()
        first = position == 0
        group_target = target[first]  # one label per group, read from its first row
        if count and bool(((group_target >= matrix.shape[1]) & (group_target != IGNORE_INDEX)).any()):
            raise ValueError("a multiple-choice label is not the index of one of its example's choices")
        per_group = nn.functional.cross_entropy(matrix, group_target, reduction="none", ignore_index=IGNORE_INDEX)
        loss = torch.zeros_like(scores).index_put((torch.nonzero(first, as_tuple=True)[0],), per_group)
        counted = torch.zeros_like(scores).index_put(
            (torch.nonzero(first, as_tuple=True)[0],), (group_target != IGNORE_INDEX).to(scores.dtype)
        )
        return HeadOutput(scores, loss, counted)

    def decode(self, logits: torch.Tensor, **context: Any) -> list[str]:
        """The name of the best choice of every example (one output per encoded row, not per sequence)."""
        best = self.choice_matrix(logits, context["group_index"]).argmax(-1).tolist()
        return [self.label_names[i] for i in best]


class CandidateScoringHead(PooledScoreHead):
    """Score one candidate per encoded row (SuperGLUE ReCoRD): is this candidate a right answer?

    Each candidate of an example is its own encoded row (the passage with the query's placeholder filled by
    the candidate), labelled 1 (a right answer) or 0. The loss is the binary cross-entropy of one logit per
    row -- candidates are trained independently, as the SuperGLUE BERT baseline does for ReCoRD, so an example
    with 50 candidates never needs 50 sequences in one batch -- and decoding returns the logit itself: the
    task ranks an example's candidates by it (see ``RecordTask.postprocess``).
    """

    kind = "candidate_scoring"

    def loss(self, scores: torch.Tensor, labels: torch.Tensor, **context: Any) -> HeadOutput:
        target = label_matrix(labels, scores.shape[0])[:, 0]
        labelled = target != IGNORE_INDEX
        if bool((labelled & (target != 0) & (target != 1)).any()):
            raise ValueError("candidate labels must be 0 or 1")
        loss = nn.functional.binary_cross_entropy_with_logits(
            scores, torch.where(labelled, target, torch.zeros_like(target)).to(scores.dtype), reduction="none"
        )
        return HeadOutput(scores, torch.where(labelled, loss, torch.zeros_like(loss)), labelled.to(loss.dtype))

    def decode(self, logits: torch.Tensor, **context: Any) -> list[float]:
        return [float(x) for x in logits.reshape(-1).tolist()]
