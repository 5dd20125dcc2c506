"""Mixout (Lee et al., 2020, eq. 3): p = 0 is the plain layer, E[w̃] = w, evaluation uses w, ∂w̃/∂w = M/(1−p),
and applying it to an encoder swaps only its trainable linear layers, turns its dropout off and adds no
checkpoint keys."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import nn

from mtft.models.mixout import MixoutLinear, apply_mixout


def linear_pair(p: float, seed: int = 0, bias: bool = True) -> tuple[nn.Linear, MixoutLinear]:
    """A linear layer, and a Mixout copy of it whose weight has moved away from u (so that w ≠ u)."""
    torch.manual_seed(seed)
    plain = nn.Linear(5, 3, bias=bias).double()
    mixed = MixoutLinear.from_linear(nn.Linear(5, 3, bias=bias).double(), p)
    mixed.load_state_dict(plain.state_dict())  # u stays the layer's first weights; w is plain's
    return plain, mixed


def test_p_zero_is_bit_identical_in_outputs_gradients_and_a_training_step():
    plain, mixed = linear_pair(0.0)
    x = torch.randn(7, 5, dtype=torch.float64)
    for layer in (plain, mixed):
        layer.train()
        torch.optim.SGD(layer.parameters(), lr=0.1).zero_grad()
    out_plain, out_mixed = plain(x), mixed(x)
    assert torch.equal(out_plain, out_mixed)
    out_plain.square().sum().backward()
    out_mixed.square().sum().backward()
    assert torch.equal(plain.weight.grad, mixed.weight.grad) and torch.equal(plain.bias.grad, mixed.bias.grad)
    for layer in (plain, mixed):
        torch.optim.SGD(layer.parameters(), lr=0.1).step()
    assert torch.equal(plain.weight, mixed.weight) and torch.equal(plain(x), mixed(x))


def test_expectation_is_the_weight_exactly_over_every_mask():
    """E_M[w̃] = w, by enumerating all 2^4 masks of a 2×2 layer with their Bernoulli(1−p) probabilities."""
    p = 0.3
    layer = MixoutLinear(2, 2, True, p, torch.tensor([[1.0, -2.0], [0.5, 3.0]], dtype=torch.float64))
    layer.weight = nn.Parameter(torch.tensor([[0.2, 0.7], [-1.5, 4.0]], dtype=torch.float64))
    u, w = layer.target, layer.weight.detach()
    expectation = torch.zeros_like(w)
    for bits in itertools.product([0.0, 1.0], repeat=4):
        mask = torch.tensor(bits, dtype=torch.float64).view(2, 2)
        probability = math.prod((1 - p) if b else p for b in bits)
        mixed = (mask * w + (1 - mask) * u - p * u) / (1 - p)  # eq. 3 as Lee et al. write it
        expectation += probability * mixed
    assert torch.allclose(expectation, w, atol=1e-12)


def test_expectation_by_monte_carlo_within_its_standard_error():
    """The layer's own draws: the mean of N mixed weights is w within 5 standard errors, where
    Var[w̃] = p/(1−p)·(w − u)² per entry (w̃ = u + M(w − u)/(1−p))."""
    p, draws = 0.4, 20000
    _, layer = linear_pair(p, seed=1)
    with torch.no_grad():
        layer.weight.add_(torch.randn_like(layer.weight))  # move w away from u
    layer.train()
    torch.manual_seed(2)
    with torch.no_grad():
        samples = torch.stack([layer.mixed_weight() for _ in range(draws)])
    w, u = layer.weight.detach(), layer.target
    standard_error = torch.sqrt(p / (1 - p) * (w - u) ** 2 / draws)
    assert torch.all((samples.mean(0) - w).abs() <= 5 * standard_error + 1e-12)
    # and each draw is one of the two values the definition allows, entry by entry
    kept, swapped = u + (w - u) / (1 - p), u
    assert torch.all(torch.isclose(samples, kept) | torch.isclose(samples, swapped))
    assert abs((torch.isclose(samples, swapped).double().mean() - p).item()) < 0.01  # P(swap) = p


def test_eval_mode_uses_the_weight_itself():
    plain, mixed = linear_pair(0.9)
    x = torch.randn(4, 5, dtype=torch.float64)
    mixed.eval()
    assert torch.equal(mixed(x), plain(x)) and mixed.mixed_weight() is mixed.weight
    mixed.train()
    assert not torch.equal(mixed(x), plain(x))


def test_gradient_with_respect_to_the_weight_is_the_mask_over_one_minus_p():
    p = 0.5
    _, layer = linear_pair(p, seed=3, bias=False)
    layer.train()
    x = torch.randn(6, 5, dtype=torch.float64)
    torch.manual_seed(4)
    layer(x).sum().backward()
    torch.manual_seed(4)  # the same mask again
    mask = torch.bernoulli(torch.full_like(layer.weight, 1 - p))
    # loss = Σ x w̃ᵀ: ∂loss/∂w̃_ij = Σ_n x_nj, then ∂w̃/∂w = M/(1−p)
    expected = mask / (1 - p) * x.sum(0).expand_as(layer.weight)
    assert 0 < mask.sum() < mask.numel()  # the check sees kept and swapped entries
    assert torch.allclose(layer.weight.grad, expected, atol=1e-12)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.dense = nn.Linear(4, 4)
        self.frozen = nn.Linear(4, 4)
        self.frozen.requires_grad_(False)
        self.dropout = nn.Dropout(0.1)
        self.inner = nn.Sequential(nn.Linear(4, 2), nn.Dropout(0.2))


def test_apply_swaps_trainable_linears_turns_dropout_off_and_keeps_the_state_dict():
    block = Block()
    before = {k: v.clone() for k, v in block.state_dict().items()}
    weight = block.dense.weight
    assert apply_mixout(block, 0.2) == 2
    assert isinstance(block.dense, MixoutLinear) and isinstance(block.inner[0], MixoutLinear)
    assert type(block.frozen) is nn.Linear  # frozen weights are not mixed
    assert block.dense.weight is weight and torch.equal(block.dense.target, weight.detach())
    assert block.dropout.p == 0.0 and block.inner[1].p == 0.0
    state = block.state_dict()  # u is not persistent: checkpoints gain no keys
    assert state.keys() == before.keys() and all(torch.equal(state[k], before[k]) for k in before)
    assert {n for n, _ in block.named_parameters()} == {n for n, _ in Block().named_parameters()}


def test_apply_with_p_zero_changes_nothing():
    block = Block()
    assert apply_mixout(block, 0.0) == 0
    assert type(block.dense) is nn.Linear and block.dropout.p == 0.1


def test_target_stays_fixed_while_the_weight_trains():
    _, layer = linear_pair(0.1, seed=5)
    u = layer.target.clone()
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.5)
    layer.train()
    layer(torch.randn(3, 5, dtype=torch.float64)).sum().backward()
    optimizer.step()
    assert torch.equal(layer.target, u) and not torch.equal(layer.weight.detach(), u)
    assert not layer.target.requires_grad and "target" not in dict(layer.named_parameters())


def test_probability_out_of_range_is_refused():
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        MixoutLinear(2, 2, True, 1.0, torch.zeros(2, 2))
