"""MHLoss (Fu, So & Collier, 2023, eq. 10): H copies of a pooled head's final linear layer."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from mtft.models.heads import PooledHead
from mtft.models.multihead import MultiLinear, average_heads, collapse_stacked_heads
from mtft.tasks.kinds import build_head

HIDDEN, ROWS, WIDTH, H = 8, 6, 5, 4
KINDS = {
    "sequence_classification": ["a", "b", "c"],
    "regression": ["score"],
    "multiple_choice": ["choice1", "choice2"],
    "candidate_scoring": ["answer"],
}


def batch(kind: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, dict]:
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(ROWS, WIDTH, HIDDEN, generator=generator)
    context: dict = {"attention_mask": torch.ones(ROWS, WIDTH, dtype=torch.long)}
    if kind == "sequence_classification":
        labels = torch.tensor([0, 2, 1, -100, 2, 0], dtype=torch.float64)
    elif kind == "regression":
        labels = torch.rand(ROWS, generator=generator, dtype=torch.float64) * 5
    elif kind == "multiple_choice":  # three examples of two choices
        labels = torch.tensor([1, 1, 0, 0, 1, 1], dtype=torch.float64)
        context["group_index"] = torch.tensor([0, 0, 1, 1, 2, 2])
    else:
        labels = torch.tensor([1, 0, 0, 1, -100, 1], dtype=torch.float64)
    return hidden, labels, context


def multi_head(kind: str, heads: int = H, seed: int = 0) -> PooledHead:
    torch.manual_seed(seed)
    head = build_head(kind, HIDDEN, KINDS[kind], 0.0)
    assert isinstance(head, PooledHead)
    head.use_heads(heads)
    return head


def single_heads(head: PooledHead) -> list[PooledHead]:
    """The H heads as H ordinary heads sharing the pooler's weights."""
    assert isinstance(head.out_proj, MultiLinear)
    out = []
    for h in range(head.out_proj.num_heads):
        single = copy.deepcopy(head)
        linear = nn.Linear(HIDDEN, head.num_outputs())
        with torch.no_grad():
            linear.weight.copy_(head.out_proj.weight[h])
            linear.bias.copy_(head.out_proj.bias[h])
        single.out_proj = linear
        out.append(single)
    return out


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_loss_is_the_mean_over_heads_of_each_heads_loss(kind):
    head = multi_head(kind)
    hidden, labels, context = batch(kind)
    out = head(hidden, labels, **context)
    singles = [single(hidden, labels, **context) for single in single_heads(head)]
    by_hand = torch.stack([s.loss_sum for s in singles]).mean(0)
    assert torch.allclose(out.loss_sum, by_hand, atol=1e-6)
    assert torch.equal(out.loss_count, singles[0].loss_count)
    # the heads really differ, so the mean is not the loss of any one of them
    assert not torch.allclose(singles[0].loss_sum, singles[1].loss_sum)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_averaged_head_is_the_mean_of_the_heads_and_predicts_their_mean_logits(kind):
    head = multi_head(kind)
    hidden, _, context = batch(kind)
    torch.manual_seed(0)
    plain = build_head(kind, HIDDEN, KINDS[kind], 0.0)
    plain.load_state_dict(average_heads(head.state_dict(), head))  # strict: an ordinary single head
    assert isinstance(plain.out_proj, nn.Linear)
    assert isinstance(head.out_proj, MultiLinear)
    assert torch.equal(plain.out_proj.weight, head.out_proj.weight.mean(0))
    assert torch.equal(plain.out_proj.bias, head.out_proj.bias.mean(0))
    mean_logits = torch.stack([single.logits(hidden, **context) for single in single_heads(head)]).mean(0)
    assert torch.allclose(plain.logits(hidden, **context), mean_logits, atol=1e-6)
    assert torch.allclose(head.logits(hidden, **context), mean_logits, atol=1e-6)  # prediction during training
    assert torch.allclose(head.out_proj.averaged().weight, plain.out_proj.weight)


def test_heads_are_initialised_independently_and_deterministically_from_the_seed():
    first, again, other = (multi_head("sequence_classification", seed=s) for s in (3, 3, 4))
    weights = first.out_proj.weight
    assert torch.equal(weights, again.out_proj.weight)
    assert not torch.equal(weights, other.out_proj.weight)
    for a in range(H):
        for b in range(a + 1, H):
            assert not torch.allclose(weights[a], weights[b])
    torch.manual_seed(3)
    plain = build_head("sequence_classification", HIDDEN, KINDS["sequence_classification"], 0.0)
    assert torch.equal(weights[0], plain.out_proj.weight)  # head 0 is the plain head's own initialisation


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_one_head_is_bit_identical_to_plain_fine_tuning(kind):
    torch.manual_seed(7)
    plain = build_head(kind, HIDDEN, KINDS[kind], 0.1)
    plain_rng = torch.get_rng_state()
    torch.manual_seed(7)
    one = build_head(kind, HIDDEN, KINDS[kind], 0.1)
    assert isinstance(one, PooledHead)
    one.use_heads(1)
    assert torch.equal(plain_rng, torch.get_rng_state())  # no extra draw: what follows is unchanged too
    assert type(one.out_proj) is nn.Linear
    assert {k: v.shape for k, v in plain.state_dict().items()} == {k: v.shape for k, v in one.state_dict().items()}
    assert all(torch.equal(v, one.state_dict()[k]) for k, v in plain.state_dict().items())
    hidden, labels, context = batch(kind)
    losses = []
    for head in (plain, one):
        torch.manual_seed(11)  # the same dropout masks
        out = head(hidden, labels, **context)
        out.loss_sum.sum().backward()
        losses.append(out.loss_sum)
    assert torch.equal(losses[0], losses[1])
    for (name, p), (_, q) in zip(plain.named_parameters(), one.named_parameters()):
        assert p.grad is not None and torch.equal(p.grad, q.grad), name


def test_a_training_checkpoint_keeps_every_head_and_loads_back_exactly():
    head = multi_head("sequence_classification")
    with torch.no_grad():
        head.out_proj.weight.add_(torch.randn_like(head.out_proj.weight))  # as if trained
    state = head.state_dict()
    assert state["out_proj.weight"].shape == (H, 3, HIDDEN) and state["out_proj.bias"].shape == (H, 3)
    resumed = multi_head("sequence_classification", seed=99)
    resumed.load_state_dict(state)
    assert all(torch.equal(v, resumed.state_dict()[k]) for k, v in state.items())


def test_a_training_checkpoint_loads_into_a_one_head_model_as_the_averaged_head():
    head = multi_head("regression")
    plain = build_head("regression", HIDDEN, KINDS["regression"], 0.0)
    collapsed = collapse_stacked_heads(head.state_dict(), plain.state_dict())
    plain.load_state_dict(collapsed)
    assert torch.equal(plain.out_proj.weight, head.out_proj.weight.mean(0))
    assert torch.equal(plain.dense.weight, head.dense.weight)
    # an ordinary state dict passes through untouched
    assert all(torch.equal(v, plain.state_dict()[k]) for k, v in collapse_stacked_heads(collapsed, collapsed).items())
