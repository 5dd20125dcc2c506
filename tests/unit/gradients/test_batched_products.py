"""The per-objective products in a few batched calls: a Linear layer's cost in calls does not grow with T, and a
batched write lands where T single writes would."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mtft.core.rows import labelled_rows
from mtft.gradients import PerObjectiveGradients


def _count_calls(monkeypatch, calls: dict[str, int]) -> None:
    """Count the rules' calls of torch's matrix products and index-adds (the backward pass's hooks run them)."""
    for owner, name in [(torch, "bmm"), (torch, "mm"), (torch.Tensor, "addmm_"), (torch.Tensor, "index_add_")]:
        original = getattr(owner, name)

        def counted(*args, _original=original, _name=name, **kwargs):
            calls[_name] = calls.get(_name, 0) + 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(owner, name, counted)


@pytest.mark.parametrize("objectives", [4, 48])
def test_a_linear_layer_costs_the_same_few_calls_whatever_the_number_of_objectives(objectives, monkeypatch):
    """T objectives with a row each: one batched product for the weight, one index-add each for the products' write
    and the bias's sum, not T of each; and the products are the per-objective sums."""
    torch.manual_seed(0)
    layer = nn.Linear(6, 5).double()
    collector = PerObjectiveGradients(layer, objectives).attach()
    x = torch.randn(objectives, 7, 6, dtype=torch.float64)
    labels = torch.arange(objectives)
    collector.zero()
    with collector.capturing(), labelled_rows(objective=labels):
        loss = layer(x).pow(2).sum()
    calls: dict[str, int] = {}
    with monkeypatch.context() as patched:
        _count_calls(patched, calls)
        loss.backward()
    collector.finalize()
    assert calls.get("bmm", 0) == 1
    assert calls.get("mm", 0) + calls.get("addmm_", 0) == 0
    assert calls.get("index_add_", 0) == 1  # the bias's sums (the weight's products are the first write: a copy)
    for t in range(objectives):
        layer.zero_grad()
        layer(x[t : t + 1]).pow(2).sum().backward()
        torch.testing.assert_close(collector.gradient(layer.weight)[t], layer.weight.grad, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(collector.gradient(layer.bias)[t], layer.bias.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "calls",
    [
        [[0, 1, 2]],  # one run of rows, first writes: straight into the buffer
        [[0, 1, 2], [0, 1, 2]],  # then adds in place
        [[0, 2]],  # not one run: through a temporary
        [[1], [0, 1, 2]],  # first and later writes mixed
    ],
    ids=["run", "run-twice", "gap", "mixed"],
)
def test_batched_products_land_in_every_objectives_buffer_as_one_at_a_time_would(calls):
    torch.manual_seed(1)
    layer = nn.Linear(3, 2).double()
    batched = PerObjectiveGradients(layer, 4)
    single = PerObjectiveGradients(layer, 4)
    for objectives in calls:
        a = torch.randn(len(objectives), 2, 5, dtype=torch.float64)
        b = torch.randn(len(objectives), 5, 3, dtype=torch.float64)
        batched.write_products(layer.weight, torch.tensor(objectives), a, b)
        for i, t in enumerate(objectives):
            single.write_product(layer.weight, t, a[i], b[i])
    batched.finalize()
    single.finalize()
    torch.testing.assert_close(batched.gradient(layer.weight), single.gradient(layer.weight), rtol=1e-12, atol=1e-12)
    assert batched.gradient(layer.weight)[3].abs().sum() == 0  # never written: zero
