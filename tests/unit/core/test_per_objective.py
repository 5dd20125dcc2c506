"""The rows' grouping behind the batched per-objective products (mtft.core.per_objective.RowGroups)."""

from __future__ import annotations

import pytest
import torch

from mtft.core.per_objective import RowGroups, SegmentList, grouped
from mtft.gradients.per_objective import _segments


def _segments_of(labels: list[int]) -> SegmentList:
    return _segments(torch.tensor(labels))  # as the collector forms them


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
