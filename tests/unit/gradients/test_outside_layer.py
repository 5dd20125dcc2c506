"""A layer defined outside mtft gets exact per-objective gradients by providing its own products
(mtft.core.per_objective.PerObjectiveLayer), dense or row-sparse, without editing mtft."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mtft.core.rows import labelled_rows
from mtft.gradients import PerObjectiveGradients, reference_objective_gradients
from tests.helpers.gradients import hooked_gradients


class Gate(nn.Module):
    """y = x ⊙ s + c, per feature: ∂L_t/∂s = Σ_{n∈t} δ_n ⊙ x_n, ∂L_t/∂c = Σ_{n∈t} δ_n."""

    def __init__(self, width: int):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(width, dtype=torch.float64))
        self.shift = nn.Parameter(torch.randn(width, dtype=torch.float64))

    def forward(self, x):
        return x * self.scale + self.shift

    def per_objective_input(self, inputs, output):
        return inputs[0].detach(), 0

    def per_objective_row_sparse(self):
        return []

    def per_objective_products(self, x, segments, grad, out):
        for t, rows in segments:
            g, xs = grad[rows].reshape(-1, grad.shape[-1]), x[rows].reshape(-1, x.shape[-1])
            out.write(self.scale, t, (g * xs).sum(0))
            out.write(self.shift, t, g.sum(0))


class TokenShift(nn.Module):
    """y = x + E[id]: a table of which a step touches the looked-up rows only (row-sparse)."""

    def __init__(self, vocab: int, width: int):
        super().__init__()
        self.table = nn.Parameter(torch.randn(vocab, width, dtype=torch.float64))

    def forward(self, x, ids):
        return x + self.table[ids]

    def per_objective_input(self, inputs, output):
        return inputs[1].detach(), 0

    def per_objective_row_sparse(self):
        return [self.table]

    def per_objective_products(self, ids, segments, grad, out):
        buffer = out.rows(self.table)
        for t, rows in segments:
            index, g = ids[rows].reshape(-1), grad[rows].reshape(-1, grad.shape[-1])
            buffer.store[t].index_add_(0, buffer.slots(index), g.to(out.dtype))


class Model(nn.Module):
    def __init__(self, vocab=11, width=5, classes=3):
        super().__init__()
        self.embed = nn.Embedding(vocab, width, dtype=torch.float64)
        self.gate, self.shift = Gate(width), TokenShift(vocab, width)
        self.out = nn.Linear(width, classes, dtype=torch.float64)
        self.num_objectives = 3

    def forward(self, ids, labels, objective_index):
        with labelled_rows(objective=objective_index):
            hidden = torch.tanh(self.shift(self.gate(self.embed(ids)), ids)).mean(1)
            losses = nn.functional.cross_entropy(self.out(hidden), labels, reduction="none")
        return torch.zeros(self.num_objectives, dtype=losses.dtype).index_add(0, objective_index, losses), None


def test_a_layer_defined_outside_mtft_gets_exact_per_objective_gradients():
    torch.manual_seed(0)
    model = Model()
    batch = dict(
        ids=torch.randint(0, 11, (6, 4)),
        labels=torch.tensor([0, 2, 1, 1, 0, 2]),
        objective_index=torch.tensor([2, 0, 1, 1, 0, 2]),  # unsorted: the segments are index tensors
    )
    got, params = hooked_gradients(model, batch, 3)
    want = reference_objective_gradients(model, batch, params, 3)
    row_sparse = set(PerObjectiveGradients(model, 3).sparse)
    assert row_sparse == {model.embed.weight, model.shift.table}  # the layer's own word: row-sparse
    assert (want.abs().sum(1) > 0).all()  # every objective has a gradient to get right
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_a_layer_without_its_own_products_is_refused_by_name():
    class Plain(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(3))

    model = nn.Sequential(nn.Linear(3, 3), Plain())
    with pytest.raises(ValueError, match=r"PerObjectiveLayer.*: 1 \(Plain\)$"):
        PerObjectiveGradients(model, 2)
