"""The sharded per-objective gradients of two gloo processes give the unsharded Gram, combination and dot
products to float32 round-off, identically on both ranks, with each layer reduce-scattered during the backward pass
(one layer's staging in flight at a time) over two micro-batches; with float32 and with bfloat16 buffers."""

from __future__ import annotations

import os

import pytest
import torch

from mtft.gradients import LayerwiseGradients, PerObjectiveGradients, ShardedGradients
from tests.helpers.launch import free_port, run_ranks
from tests.helpers.sharded import OBJECTIVES, Toy, _rank_batch

WORLD = 2
MICRO_BATCHES = 2


def _worker(rank: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        for dtype in (torch.float32, torch.bfloat16):  # gradients.buffers: full, bfloat16
            _check_rank(rank, dtype)
    finally:
        torch.distributed.destroy_process_group()


def _backward_passes(model: Toy, collector: PerObjectiveGradients, rank: int, sharded=None) -> torch.Tensor:
    """The step's micro-batches through ``collector`` (and ``sharded``); the all-reduced counts."""
    collector.zero()
    if sharded is not None:
        sharded.zero()
    detached = {name: p.detach() for name, p in model.named_parameters()}
    counts = torch.zeros(OBJECTIVES, dtype=torch.float64)
    for micro in range(MICRO_BATCHES):
        ids, objective, labels = _rank_batch(rank, micro)
        with collector.capturing():
            sums = torch.func.functional_call(model, detached, args=(ids, objective, labels))
        batch_counts = torch.bincount(objective, minlength=OBJECTIVES).double()
        if sharded is None:
            sums.sum().backward()
        else:
            sharded.backward(sums.sum(), batch_counts)
        counts += batch_counts
    collector.finalize()
    torch.distributed.all_reduce(counts)
    return counts


def _check_rank(rank: int, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    reference_model = Toy()
    reference = PerObjectiveGradients(reference_model, OBJECTIVES, dtype=dtype).attach()
    counts = _backward_passes(reference_model, reference, rank)
    torch.distributed.all_reduce(reference.flat)  # the unsharded path: every rank holds every reduced g_t
    reference.reduce_row_sparse()
    assert (counts > 0).tolist() == [True, True, True, False]

    torch.manual_seed(0)
    model = Toy()
    collector = PerObjectiveGradients(model, OBJECTIVES, dtype=dtype, dense_in_buffer=False).attach()
    assert collector.width == 0  # no T × P buffer: the dense layers go to the shards, the embedding keeps its rows
    sharded = ShardedGradients(collector, rank, WORLD)
    layers = [model.norm, model.hidden, model.unused, model.out, model.other]
    assert sharded.shard.shape == (OBJECTIVES, sum(-(-sum(p.numel() for p in m.parameters()) // WORLD) for m in layers))
    _backward_passes(model, collector, rank, sharded)
    collector.reduce_row_sparse()
    # The layers were reduced one at a time as the backward pass completed them (the unused one never waited for)
    element = sharded.shard.element_size()
    largest = max(3 * WORLD * -(-sum(p.numel() for p in m.parameters()) // WORLD) for m in layers) * element
    assert 0 < sharded.peak_staging_bytes <= largest

    params = [p for p in model.parameters()]
    by_name = dict(zip([n for n, _ in model.named_parameters()], params))
    reference_of = dict(zip(params, reference_model.parameters()))
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
    # float32: round-off of the sums' order; bfloat16: the sharded path rounds each micro-batch's reduced layer to
    # bfloat16 before adding it to the shard, the unsharded path each rank's sum over micro-batches before reducing
    close = 1e-6 if dtype == torch.float32 else 2e-2
    combined = sharded.combine(weights)
    expected_combined = reference.combine(weights)
    for p in params:
        expected = expected_combined[reference_of[p]]
        atol = close * max(expected.abs().max().item(), 1e-1)
        torch.testing.assert_close(combined[p], expected, rtol=close, atol=atol)
        _assert_same_on_every_rank(combined[p])
    assert (combined[by_name["unused.weight"]] == 0).all()  # no gradient reaches it
    untouched = torch.ones(37, dtype=torch.bool)
    untouched[collector.touched_rows(model.embedding.weight)] = False
    assert untouched.any() and (combined[model.embedding.weight][untouched] == 0).all()
    # what the step hands the engine instead: N × this rank's part, zeros elsewhere; averaged over the ranks (as
    # the engine averages every gradient) it is the combined gradient bit for bit (WORLD = 2, a power of two)
    contribution = sharded.contribution(weights)
    assert set(contribution) == set(combined)
    for p in params:
        averaged = contribution[p].clone()
        torch.distributed.all_reduce(averaged)
        assert torch.equal(averaged / WORLD, combined[p]), [n for n, q in by_name.items() if q is p]
    dense = [p for p in params if p is not model.embedding.weight]
    mine = sum(int((contribution[p] != 0).sum()) for p in dense)
    assert 0 < mine < sum(int((combined[p] != 0).sum()) for p in dense)  # this rank's part only

    def on_reference(case):
        params, only_rows, metric = case
        remap = reference_of.__getitem__
        return (
            [remap(p) for p in params],
            None if only_rows is None else {remap(p): r for p, r in only_rows.items()},
            None if metric is None else {remap(p): m for p, m in metric.items()},
        )

    for name, case in cases.items():
        got, expected = sharded.gram(*case), reference.gram(*on_reference(case))
        assert got.dtype == torch.float64
        assert expected[:3, :3].abs().min() > 0, name  # the objectives present have non-zero gradients
        scale = expected.abs().max().item()
        torch.testing.assert_close(got, expected, rtol=2 * close, atol=(1e-3 * close) * scale)
        _assert_same_on_every_rank(got)
    expected_dots = reference.dot({reference_of[p]: v for p, v in vectors.items()})
    torch.testing.assert_close(sharded.dot(vectors), expected_dots, rtol=close, atol=close * expected_dots.abs().max())
    if dtype == torch.float32:
        for chunk_bytes in (None, CHUNKED):
            _check_layerwise(rank, reference, cases, on_reference, weights, vectors, reference_of, chunk_bytes)


# 16 elements of each of the 4 objectives' products at a time: the Linear weights by windows of 3 or 2 rows, the
# embedding by windows of 3 of the touched rows (each rank's differ: the windows are their union's)
CHUNKED = 16 * OBJECTIVES * 4


def _check_layerwise(rank, reference, cases, on_reference, weights, vectors, reference_of, chunk_bytes) -> None:
    """The bufferless path (gradients.buffers: none) on the same ranks and micro-batches: each layer's
    products formed from the tape after the backward passes, reduce-scattered, its partial Gram added; the same
    answers, identical on both ranks; what it hands the engine averages to the combination. ``chunk_bytes``: also
    with every layer formed in chunks."""
    torch.manual_seed(0)
    model = Toy()
    collector = PerObjectiveGradients(model, OBJECTIVES, dense_in_buffer=False).attach()
    layerwise = LayerwiseGradients(collector, rank, WORLD, chunk_bytes=chunk_bytes)
    _backward_passes(model, collector, rank)
    mine = dict(zip(reference_of, model.parameters()))  # the sharded model's parameters -> this model's
    for params, only_rows, metric in cases.values():
        case = (
            [mine[p] for p in params],
            None if only_rows is None else {mine[p]: r for p, r in only_rows.items()},
            None if metric is None else {mine[p]: m for p, m in metric.items()},
        )
        got, expected = layerwise.gram(*case), reference.gram(*on_reference((params, only_rows, metric)))
        scale = expected.abs().max().item()
        torch.testing.assert_close(got, expected, rtol=2e-6, atol=1e-9 * scale)
        _assert_same_on_every_rank(got)
    expected_combined = reference.combine(weights)
    contribution = layerwise.contribution(weights)
    for p, q in mine.items():
        averaged = contribution[q].clone()
        torch.distributed.all_reduce(averaged)
        expected = expected_combined[reference_of[p]]
        atol = 1e-6 * max(expected.abs().max().item(), 1e-1)
        torch.testing.assert_close(averaged / WORLD, expected, rtol=1e-6, atol=atol)
    expected_dots = reference.dot({reference_of[p]: v for p, v in vectors.items()})
    dots = layerwise.dot({mine[p]: v for p, v in vectors.items()})
    torch.testing.assert_close(dots, expected_dots, rtol=1e-6, atol=1e-6 * expected_dots.abs().max())
    _assert_same_on_every_rank(dots)
    if chunk_bytes is not None:  # the chunks held at most the budget (a window of rows, plus the discard slot)
        assert 0 < layerwise.peak_layer_bytes <= chunk_bytes + OBJECTIVES * 5 * 4


def _assert_same_on_every_rank(tensor: torch.Tensor) -> None:
    """Bit-identical on every rank: the ranks solve and step with the same numbers."""
    copies = [torch.empty_like(tensor) for _ in range(WORLD)]
    torch.distributed.all_gather(copies, tensor.contiguous())
    assert all(torch.equal(copies[0], c) for c in copies[1:])


@pytest.mark.timeout(180)
def test_two_gloo_ranks_shard_the_gram_combination_and_dot_products_exactly():
    """A failed assertion in either rank raises here with its traceback; a hung collective fails the timeout."""
    run_ranks(_worker, (free_port(),), WORLD)


def _contribution_worker(rank: int, port: int, world: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    try:
        _check_contribution(rank, world)
    finally:
        torch.distributed.destroy_process_group()


def _check_contribution(rank: int, world: int) -> None:
    """What the step hands the engine, averaged over ``world`` ranks as DeepSpeed averages a gradient -- the sum
    times 1/N (ZeRO-0/1's all-reduce) or each rank's share divided by N before the sum (ZeRO-2/3's reduce-scatter)
    -- against the all-gathered combination: bit for bit when N is a power of two, within two float32 ulps when not
    (where N·x and the scaling by 1/N each round, and do on some coordinates)."""
    torch.manual_seed(0)
    model = Toy()
    collector = PerObjectiveGradients(model, OBJECTIVES, dense_in_buffer=False).attach()
    sharded = ShardedGradients(collector, rank, world)
    counts = _backward_passes(model, collector, rank, sharded)
    collector.reduce_row_sparse()
    weights = torch.tensor([0.5, 0.2, 0.3, 0.0], dtype=torch.float64) / counts.clamp(min=1)
    combined, contribution = sharded.combine(weights), sharded.contribution(weights)
    assert set(contribution) == set(combined)
    exact = world & (world - 1) == 0
    differ = 0
    for p in model.parameters():
        assert contribution[p].shape == p.shape and contribution[p].dtype == combined[p].dtype == torch.float32
        holders = (contribution[p] != 0).int()
        torch.distributed.all_reduce(holders)
        assert holders.max() <= 1  # the sum adds zeros only: exact in whatever order the collective adds
        postscaled, prescaled = contribution[p].clone(), contribution[p] / world
        torch.distributed.all_reduce(postscaled)
        torch.distributed.all_reduce(prescaled)
        for averaged in (postscaled.mul_(1.0 / world), prescaled):
            if exact:
                assert torch.equal(averaged, combined[p])
            else:
                ulp = torch.finfo(torch.float32).eps * combined[p].abs()
                assert ((averaged - combined[p]).abs() <= 2 * ulp).all()
                differ += int((averaged != combined[p]).sum())
    assert exact or differ > 0  # round-off, not bit-identity, for N not a power of two


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world", [3, 4])
def test_the_engines_average_of_the_contributions_is_the_combination(world: int):
    """Each coordinate of the contributions is non-zero on one rank at most (the row-sparse weights' on rank 0), so
    the sum over ranks is exact in any order, on four ranks as on two; only the 1/N scaling can round."""
    run_ranks(_contribution_worker, (free_port(), world), world)


def test_a_collector_holding_its_dense_gradients_is_refused():
    """The sharded path writes the dense parameters' gradients layer by layer into its own staging buffers: a
    collector that also keeps a T × P buffer for them would defeat it."""
    with pytest.raises(ValueError, match="dense_in_buffer=False"):
        ShardedGradients(PerObjectiveGradients(Toy(), OBJECTIVES), 0, 2)
    sparse_only = PerObjectiveGradients(Toy(), OBJECTIVES, dense_in_buffer=False)
    assert sparse_only.flat.shape == (OBJECTIVES, 0)
