"""bfloat16 per-objective buffers (``gradients.buffers: bfloat16``): each g_t is rounded to bfloat16, and
nothing else -- the Gram, the combination and the dot products are accumulated in float32/float64, so they equal
those of the rounded gradients computed in float64 to float32 round-off."""

from __future__ import annotations

import torch

from mtft.gradients import PerObjectiveGradients
from tests.helpers.sharded import OBJECTIVES, Toy, _rank_batch


def collected(dtype: torch.dtype) -> tuple[Toy, PerObjectiveGradients]:
    torch.manual_seed(0)
    model = Toy()
    collector = PerObjectiveGradients(model, OBJECTIVES, dtype=dtype).attach()
    ids, objective, labels = _rank_batch(1, micro=1)  # objective 2 present: the second head runs
    detached = {name: p.detach() for name, p in model.named_parameters()}
    with collector.capturing():
        sums = torch.func.functional_call(model, detached, args=(ids, objective, labels))
    sums.sum().backward()
    collector.finalize()
    return model, collector


def test_bfloat16_buffers_are_rounded_gradients_accumulated_in_float32(monkeypatch):
    monkeypatch.setattr("mtft.gradients.per_objective.METRIC_CHUNK", 16)  # several chunks per block
    model, low = collected(torch.bfloat16)
    _, full = collected(torch.float32)
    assert low.flat.dtype == torch.bfloat16 and low.flat.element_size() * 2 == full.flat.element_size()
    params = list(low.names)
    rounded = {p: low.gradient(p).double() for p in params}  # the bfloat16 values, exactly, in float64
    exact_gram = sum(
        (g.reshape(OBJECTIVES, -1) @ g.reshape(OBJECTIVES, -1).t() for g in rounded.values()), torch.zeros(1)
    )
    gram = low.gram(params)
    # float32 accumulation of the rounded values: a bfloat16 product would be off by ~4e-3 relative
    torch.testing.assert_close(gram, exact_gram, rtol=1e-5, atol=1e-6 * exact_gram.abs().max().item())
    # against float32 buffers the only difference is the rounding of each g_t (8 significant bits)
    reference = full.gram(list(full.names))  # the same model and batch, float32 buffers
    assert 0 < (gram - reference).abs().max().item() < 2e-2 * reference.abs().max().item()

    weights = torch.tensor([0.5, 0.2, 0.3, 0.0], dtype=torch.float64)
    combined = low.combine(weights)
    for p in params:
        assert combined[p].dtype == torch.float32
        expected = torch.einsum("t,t...->...", weights, rounded[p])
        torch.testing.assert_close(combined[p].double(), expected, rtol=1e-5, atol=1e-6)
    vectors = {p: torch.randn(p.shape) for p in params}
    expected_dots = sum((rounded[p].reshape(OBJECTIVES, -1) @ vectors[p].double().reshape(-1)) for p in params)
    torch.testing.assert_close(low.dot(vectors), expected_dots, rtol=1e-5, atol=1e-5)
    assert len(low.touched_rows(model.embedding.weight))  # the row-sparse path ran too
