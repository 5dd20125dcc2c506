"""The rows' grouping behind the batched per-objective products, and the few calls it leaves a layer."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mtft.core.per_objective import RowGroups, SegmentList, grouped
from mtft.core.rows import labelled_rows
from mtft.gradients import PerObjectiveGradients


def _segments_of(labels: list[int]) -> SegmentList:
    rows = torch.tensor(labels)
    values, counts = torch.unique_consecutive(rows, return_counts=True)
    if len(set(values.tolist())) == len(values):
        out, start = SegmentList(), 0
        for t, c in zip(values.tolist(), counts.tolist()):
            out.append((t, slice(start, start + c)))
            start += c
        return out
    return SegmentList((t, (rows == t).nonzero(as_tuple=True)[0]) for t in torch.unique(rows).tolist())


CASES = {
    "one each": [0, 1, 2, 3, 4, 5],
    "equal, sorted": [3, 3, 5, 5, 7, 7],
    "unequal, sorted": [0, 0, 0, 2, 4, 4, 6],
    "interleaved": [1, 0, 2, 0, 1, 1, 2],
}


@pytest.mark.parametrize("labels", CASES.values(), ids=CASES.keys())
def test_buckets_stack_each_objectives_rows_and_sums_match_the_loop(labels):
    segments = _segments_of(labels)
    x = torch.randn(len(labels), 3, 4, dtype=torch.float64)
    groups = RowGroups(segments, len(labels), x.device)
    seen = []
    for bucket in groups.buckets:
        stacked = bucket.stack(x)
        assert stacked.shape == (len(bucket.objectives), bucket.length * 3, 4)
        for i, (t, where) in enumerate(zip(bucket.objectives.tolist(), bucket.segments.tolist())):
            assert segments[where][0] == t
            assert torch.equal(stacked[i], x[segments[where][1]].reshape(-1, 4))
            seen.append(t)
    assert sorted(seen) == sorted(set(labels))  # every objective in exactly one bucket
    assert len(groups.buckets) == len({int(torch.tensor(labels).eq(t).sum()) for t in set(labels)})
    expected = torch.stack([x[rows].reshape(-1, 4).sum(0) for _, rows in segments])
    torch.testing.assert_close(groups.sums(x), expected, rtol=1e-12, atol=1e-12)
    assert torch.equal(groups.objective_of_row(), torch.tensor(labels))


def test_equal_sorted_rows_stack_as_a_view_and_the_grouping_is_formed_once():
    segments = _segments_of([0, 0, 1, 1])
    x = torch.randn(4, 5)
    groups = grouped(segments, 4, x.device)
    (bucket,) = groups.buckets
    assert bucket.rows is None and bucket.stack(x).data_ptr() == x.data_ptr()
    assert grouped(segments, 4, x.device) is groups


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
