"""Per-objective gradients (the LF-MLF hooks) of MHLoss's H heads against the float64 reference."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mtft.core.rows import labelled_rows
from mtft.gradients import PerObjectiveGradients, reference_objective_gradients
from mtft.models.multihead import MultiLinear, multi_linear
from tests.helpers.gradients import MIXED, hooked_gradients, make_batch
from tests.helpers.models import tiny_model


@pytest.mark.parametrize("sort_rows", [False, True])
def test_multi_head_gradients_equal_float64_reference(tmp_path, sort_rows):
    model, tok = tiny_model(tmp_path)
    torch.manual_seed(0)
    for head in model.heads.values():
        head.use_heads(3)
    model = model.double()
    batch = make_batch(tok, **MIXED)
    if sort_rows:
        order = torch.argsort(batch["objective_index"], stable=True)
        batch = {k: v[order] for k, v in batch.items()}
    got, params = hooked_gradients(model, batch, 3)
    assert any(isinstance(m, MultiLinear) for m in model.modules())
    expected = reference_objective_gradients(model, batch, params, 3)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


class AveragedHead(nn.Module):
    """A loss through the averaged head (``MultiLinear.forward`` without ``per_head``)."""

    def __init__(self):
        super().__init__()
        self.out_proj = multi_linear(nn.Linear(4, 2), 3)

    def forward(self, x, objective_index):
        with labelled_rows(objective=objective_index):
            y = self.out_proj(x)
        sums = torch.zeros(2, dtype=y.dtype).index_add(0, objective_index, (y**2).sum(1))
        return sums, torch.ones(2)


def test_gradients_through_the_averaged_head_equal_float64_reference():
    torch.manual_seed(0)
    model = AveragedHead().double()
    batch = {"x": torch.randn(5, 4, dtype=torch.float64), "objective_index": torch.tensor([0, 1, 1, 0, 1])}
    collector = PerObjectiveGradients(model, 2).attach()
    detached = {n: p.detach() for n, p in model.named_parameters()}
    with collector.capturing():
        sums, _ = torch.func.functional_call(model, detached, args=(), kwargs=batch)
    sums.sum().backward()
    params = list(model.parameters())
    got = torch.cat([collector.gradient(p).reshape(2, -1) for p in params], dim=1)
    torch.testing.assert_close(got, reference_objective_gradients(model, batch, params, 2), rtol=1e-10, atol=1e-12)
