"""Sharding an evaluation-like pass over ranks: which items each rank runs, equal pass counts (a ZeRO-3 forward is
a collective), reassembly in item order, uneven and empty passes -- on paper and on two gloo processes."""

from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp

from mtft.core.shards import rank_schedule, reassemble, sharded_map
from tests.helpers.launch import free_port

WORLD = 2


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("num_items", [0, 1, 2, 3, 5, 8, 9])
def test_every_item_is_kept_once_by_one_rank_and_every_rank_runs_as_many_passes(num_items, world_size):
    schedules = [rank_schedule(num_items, rank, world_size) for rank in range(world_size)]
    passes = {len(s) for s in schedules}
    assert passes == {-(-num_items // world_size)}  # equal on every rank: ⌈n / N⌉
    kept = sorted(i for s in schedules for i, keep in s if keep)
    assert kept == list(range(num_items))
    for rank, schedule in enumerate(schedules):
        assert [i for i, keep in schedule if keep] == list(range(rank, num_items, world_size))  # round-robin
        assert all(i == num_items - 1 for i, keep in schedule if not keep)  # padding reruns the last (smallest)
        assert all(keep for _, keep in schedule[:-1])  # only a rank's last pass can be padding


def test_uneven_counts_pad_the_ranks_left_short():
    assert rank_schedule(5, 0, 2) == [(0, True), (2, True), (4, True)]
    assert rank_schedule(5, 1, 2) == [(1, True), (3, True), (4, False)]
    assert rank_schedule(1, 1, 3) == [(0, False)]  # a rank with no item of its own still runs one pass
    assert rank_schedule(4, 2, 3) == [(2, True), (3, False)]
    assert rank_schedule(0, 0, 2) == []


def test_a_rank_outside_the_world_is_refused():
    with pytest.raises(ValueError, match="rank 2 is not one of 2 ranks"):
        rank_schedule(4, 2, 2)


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("num_items", [0, 1, 4, 7])
def test_reassembly_restores_item_order(num_items, world_size):
    def result(item: int) -> list[str]:  # results of unequal lengths, as batches of rows are
        return [f"{item}.{k}" for k in range(item % 3 + 1)]

    per_rank = [[result(i) for i, keep in rank_schedule(num_items, r, world_size) if keep] for r in range(world_size)]
    assert reassemble(per_rank, num_items) == [result(i) for i in range(num_items)]


def test_one_process_maps_every_item_in_order_without_a_process_group():
    assert not torch.distributed.is_initialized()
    assert sharded_map(4, lambda i: i * i) == [0, 1, 4, 9]
    assert sharded_map(0, lambda i: 1 / 0) == []


def _run(item: int, passes: list[int]) -> list:
    # a collective per pass, as a forward under ZeRO-3 is: unequal pass counts would hang here
    torch.distributed.all_reduce(torch.ones(1))
    passes.append(item)
    return [item, f"row-{item}"] * (item % 2 + 1)


def _worker(rank: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        for num_items in (0, 1, 2, 5):
            passes: list[int] = []
            results = sharded_map(num_items, lambda item, passes=passes: _run(item, passes))
            assert results == [[i, f"row-{i}"] * (i % 2 + 1) for i in range(num_items)]
            assert passes == [i for i, _ in rank_schedule(num_items, rank, WORLD)]
            counts = [None] * WORLD
            torch.distributed.all_gather_object(counts, len(passes))
            assert counts == [-(-num_items // WORLD)] * WORLD
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.timeout(180)
def test_two_gloo_ranks_share_the_items_and_both_get_every_result_in_order():
    """A failed assertion in either rank raises here; unequal collective counts would fail the timeout."""
    mp.spawn(_worker, args=(free_port(),), nprocs=WORLD, join=True)
