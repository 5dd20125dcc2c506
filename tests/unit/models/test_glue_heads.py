"""The regression, multiple-choice and candidate-scoring heads: losses against hand computations, counts, decoding."""

from __future__ import annotations

import pytest
import torch

from mtft.core.labels import IGNORE_INDEX
from mtft.models.choice_head import CandidateScoringHead, MultipleChoiceHead, choice_layout
from mtft.models.regression_head import RegressionHead
from mtft.tasks.kinds import build_head

HIDDEN = 8


def hidden_states(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, 5, HIDDEN, generator=torch.Generator().manual_seed(seed))


def test_heads_are_registered_by_kind():
    assert isinstance(build_head("regression", HIDDEN, [], 0.0), RegressionHead)
    assert isinstance(build_head("multiple_choice", HIDDEN, ["choice1", "choice2"], 0.0), MultipleChoiceHead)
    assert isinstance(build_head("candidate_scoring", HIDDEN, [], 0.0), CandidateScoringHead)


def test_regression_loss_is_the_squared_error_per_labelled_row():
    head = RegressionHead(HIDDEN, [], 0.0).eval()
    hidden = hidden_states(3)
    labels = torch.tensor([[2.5], [IGNORE_INDEX], [0.0]], dtype=torch.float64)
    out = head(hidden, labels)
    scores = head.logits(hidden)
    assert out.loss_sum.tolist() == pytest.approx([(scores[0].item() - 2.5) ** 2, 0.0, scores[2].item() ** 2])
    assert out.loss_count.tolist() == [1.0, 0.0, 1.0]
    assert head.decode(scores) == pytest.approx(scores.tolist())
    assert all(isinstance(x, float) for x in head.decode(scores))


def test_choice_layout_numbers_groups_and_positions():
    group, position, count = choice_layout(torch.tensor([4, 4, 7, 7, 7, 2, 2]))
    assert (group.tolist(), position.tolist(), count) == ([0, 0, 1, 1, 1, 2, 2], [0, 1, 0, 1, 2, 0, 1], 3)
    with pytest.raises(ValueError, match="contiguous"):
        choice_layout(torch.tensor([0, 1, 0]))
    assert choice_layout(torch.zeros(0, dtype=torch.long))[2] == 0


def test_multiple_choice_loss_is_a_softmax_over_each_examples_choices():
    head = MultipleChoiceHead(HIDDEN, ["choice1", "choice2", "choice3"], 0.0).eval()
    hidden = hidden_states(5, seed=1)
    group_index = torch.tensor([0, 0, 1, 1, 1])  # an example with 2 choices, one with 3
    labels = torch.tensor([[1.0], [1.0], [2.0], [2.0], [2.0]], dtype=torch.float64)  # one label per example, repeated
    out = head(hidden, labels, group_index=group_index)
    s = head.logits(hidden)
    first = -torch.log_softmax(s[:2], 0)[1]
    second = -torch.log_softmax(s[2:], 0)[2]
    assert out.loss_sum.tolist() == pytest.approx([first.item(), 0, second.item(), 0, 0], abs=1e-6)
    assert out.loss_count.tolist() == [1, 0, 1, 0, 0]  # one loss unit per example, on its first row
    expected = ["choice1" if s[0] > s[1] else "choice2", ["choice1", "choice2", "choice3"][int(s[2:].argmax())]]
    assert head.decode(s, group_index=group_index) == expected


def test_multiple_choice_learns_and_ignores_unlabelled_examples():
    torch.manual_seed(0)
    head = MultipleChoiceHead(HIDDEN, ["a", "b"], 0.0)
    hidden = hidden_states(4, seed=2)
    group_index = torch.tensor([0, 0, 1, 1])
    labels = torch.tensor([[0.0], [0.0], [IGNORE_INDEX], [IGNORE_INDEX]], dtype=torch.float64)
    optimizer = torch.optim.SGD(head.parameters(), lr=0.5)
    losses = []
    for _ in range(30):
        out = head(hidden, labels, group_index=group_index)
        assert out.loss_count.tolist() == [1, 0, 0, 0]
        optimizer.zero_grad()
        out.loss_sum.sum().backward()
        optimizer.step()
        losses.append(out.loss_sum.sum().item())
    assert losses[-1] < 0.1 * losses[0]


def test_multiple_choice_refuses_a_label_beyond_the_choices():
    head = MultipleChoiceHead(HIDDEN, ["a", "b"], 0.0)
    with pytest.raises(ValueError, match="not the index of one of its example's choices"):
        head(hidden_states(2), torch.tensor([[3.0], [3.0]], dtype=torch.float64), group_index=torch.tensor([0, 0]))


def test_heads_run_on_zero_rows():
    empty = torch.zeros(0, 5, HIDDEN)
    labels = torch.zeros(0, 1, dtype=torch.float64)
    for head, context in (
        (RegressionHead(HIDDEN, [], 0.0), {}),
        (MultipleChoiceHead(HIDDEN, ["a", "b"], 0.0), {"group_index": torch.zeros(0, dtype=torch.long)}),
        (CandidateScoringHead(HIDDEN, [], 0.0), {}),
    ):
        out = head(empty, labels, **context)
        assert out.loss_sum.shape == (0,) and out.loss_count.shape == (0,)
        out.loss_sum.sum().backward()  # the parameters take part (ZeRO needs every rank to touch them)


def test_candidate_scoring_is_binary_cross_entropy_and_decodes_scores():
    head = CandidateScoringHead(HIDDEN, [], 0.0).eval()
    hidden = hidden_states(3, seed=3)
    labels = torch.tensor([[1.0], [0.0], [IGNORE_INDEX]], dtype=torch.float64)
    out = head(hidden, labels)
    s = head.logits(hidden)
    expected = [-torch.nn.functional.logsigmoid(s[0]).item(), -torch.nn.functional.logsigmoid(-s[1]).item(), 0.0]
    assert out.loss_sum.tolist() == pytest.approx(expected, abs=1e-6)
    assert out.loss_count.tolist() == [1, 1, 0]
    assert head.decode(s) == pytest.approx(s.tolist())
    with pytest.raises(ValueError, match="0 or 1"):
        head(hidden, torch.tensor([[2.0], [0.0], [1.0]], dtype=torch.float64))
