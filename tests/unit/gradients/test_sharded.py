"""The sharded per-objective gradients of two gloo processes give the unsharded Gram, combination and dot
products to float32 round-off, identically on both ranks, the shard written into the accumulation buffer; with
float32 and with bfloat16 buffers."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from mtft.core.rows import labelled_rows
from mtft.gradients import PerObjectiveGradients, ShardedGradients

OBJECTIVES = 4  # the last is absent from every rank's rows: its shard stays zero without a reduce-scatter
WORLD = 2


class Toy(nn.Module):
    """Every kind of buffer: a row-sparse embedding (with a padding row) first, then dense LayerNorm and
    Linear parameters, in odd sizes so that the flat width needs padding and parameters straddle the shards."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(37, 5, padding_idx=0)
        self.norm = nn.LayerNorm(5)
        self.hidden = nn.Linear(5, 7)
        self.out = nn.Linear(7, 3)

    def forward(self, ids: torch.Tensor, objective: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        with labelled_rows(objective=objective):
            h = self.norm(self.embedding(ids)).mean(1)
            logits = self.out(torch.tanh(self.hidden(h)))
        losses = nn.functional.cross_entropy(logits, labels, reduction="none")
        return torch.zeros(OBJECTIVES).index_add(0, objective, losses)


def _rank_batch(rank: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(100 + rank)
    rows = 6 + 3 * rank  # unequal ranks
    ids = torch.randint(0, 20 + 10 * rank, (rows, 4), generator=generator)  # rank 1 touches rows rank 0 does not
    objective = torch.randint(0, OBJECTIVES - 1, (rows,), generator=generator).sort().values
    return ids, objective, torch.randint(0, 3, (rows,), generator=generator)


def _worker(rank: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        for dtype in (torch.float32, torch.bfloat16):  # gradient_buffers: full, bfloat16
            _check_rank(rank, dtype)
    finally:
        torch.distributed.destroy_process_group()


def _check_rank(rank: int, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    model = Toy()
    collector = PerObjectiveGradients(model, OBJECTIVES, dtype=dtype, pad_multiple=WORLD).attach()
    assert collector.flat.shape[1] % WORLD == 0 and collector.flat.shape[1] > collector.width
    ids, objective, labels = _rank_batch(rank)
    detached = {name: p.detach() for name, p in model.named_parameters()}
    with collector.capturing():
        sums = torch.func.functional_call(model, detached, args=(ids, objective, labels))
    sums.sum().backward()
    collector.finalize()
    counts = torch.bincount(objective, minlength=OBJECTIVES).double()
    torch.distributed.all_reduce(counts)
    present = counts > 0
    assert present.tolist() == [True, True, True, False]

    local = collector.flat.clone()
    sharded = ShardedGradients(collector, rank, WORLD)
    sharded.reduce(present)
    assert sharded.shard.shape == (OBJECTIVES, collector.flat.shape[1] // WORLD)
    assert sharded.shard.data_ptr() == collector.flat[:, sharded.start :].data_ptr()  # no T × P/N copy

    params = list(collector.views)
    subset = [p for p in params if p is not model.out.weight]  # a Gram over part of the parameters
    rows = {model.embedding.weight: torch.tensor([1, 3, 5, 7, 11, 13, 21, 25])}
    generator = torch.Generator().manual_seed(7)
    metric = {p: torch.exp(torch.randn(p.shape, generator=generator)) for p in params}  # spanning magnitudes
    cases = {
        "all": (params, None, None),
        "subset": (subset, None, None),
        "only_rows": (params, rows, None),
        "metric": (params, None, metric),
        "subset_rows_metric": (subset, rows, metric),
    }
    weights = torch.tensor([0.5, 0.2, 0.3, 0.0], dtype=torch.float64) / counts.clamp(min=1)
    vectors = {p: torch.randn(p.shape, generator=generator) for p in subset}
    grams = {name: sharded.gram(*case) for name, case in cases.items()}
    combined = {p: g.clone() for p, g in sharded.combine(weights).items()}
    dots = sharded.dot(vectors)

    collector.flat.copy_(local)
    torch.distributed.all_reduce(collector.flat)  # the unsharded path: every rank holds every reduced g_t
    for name, case in cases.items():
        expected = collector.gram(*case)
        assert grams[name].dtype == torch.float64
        assert expected[:3, :3].abs().min() > 0, name  # the objectives present have non-zero gradients
        torch.testing.assert_close(grams[name], expected, rtol=2e-6, atol=1e-9 * expected.abs().max().item())
        _assert_same_on_every_rank(grams[name])
    expected_combined = collector.combine(weights)
    for p in params:
        torch.testing.assert_close(combined[p], expected_combined[p], rtol=1e-6, atol=1e-7)
        _assert_same_on_every_rank(combined[p])
    untouched = ~collector.row_mask[model.embedding.weight]
    assert untouched.any() and (combined[model.embedding.weight][untouched] == 0).all()
    torch.testing.assert_close(dots, collector.dot(vectors), rtol=1e-6, atol=1e-6)


def _assert_same_on_every_rank(tensor: torch.Tensor) -> None:
    """Bit-identical on every rank: the ranks solve and step with the same numbers."""
    copies = [torch.empty_like(tensor) for _ in range(WORLD)]
    torch.distributed.all_gather(copies, tensor.contiguous())
    assert all(torch.equal(copies[0], c) for c in copies[1:])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.timeout(180)
def test_two_gloo_ranks_shard_the_gram_combination_and_dot_products_exactly():
    """A failed assertion in either rank raises here with its traceback; a hung collective fails the timeout."""
    mp.spawn(_worker, args=(_free_port(),), nprocs=WORLD, join=True)


def test_buffers_are_padded_to_equal_shards_and_the_padding_stays_out_of_every_result():
    model = Toy()
    collector = PerObjectiveGradients(model, OBJECTIVES, pad_multiple=3)
    assert collector.width == sum(p.numel() for p in model.parameters())
    assert collector.flat.shape[1] % 3 == 0 and collector.flat.shape[1] - collector.width < 3
    collector.flat[:, collector.width :] = 1.0  # garbage in the padding must not leak
    dense = [p for p in collector.views if p is not model.embedding.weight]
    assert collector.gram(dense).abs().max() == 0
    assert all(v.abs().max() == 0 for v in collector.combine(torch.ones(OBJECTIVES)).values())
    with pytest.raises(ValueError, match="not a multiple of 2 ranks"):
        ShardedGradients(collector, 0, 2)
