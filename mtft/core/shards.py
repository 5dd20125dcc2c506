"""Evaluation-like passes sharded across data-parallel ranks, with results identical to one process.

Items (evaluation batches) are dealt round-robin: rank r runs items r, r + N, r + 2N, ... of N ranks. Every rank
runs the same number of forward passes, ⌈n / N⌉: under DeepSpeed ZeRO-3 a forward pass is a collective (each
layer's parameters are all-gathered as it runs), so a rank left with one item fewer runs the last item once more
and discards the result -- a padding pass that runs while the others run their last item, on the last item because
it is the smallest (the remainder of the rows: batches are slices of one split).
An empty pass (n = 0) runs nothing on any rank. The per-item results are then all-gathered as Python objects and
put back in item order, so the caller sees exactly the list one process would have computed.

Why by hand: ``torch.utils.data.DistributedSampler`` pads by repeating items *into the results* (and shuffles);
evaluation needs each item once, in order, and the padding pass discarded.
"""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

import torch

T = TypeVar("T")


def rank_schedule(num_items: int, rank: int, world_size: int) -> list[tuple[int, bool]]:
    """The passes rank ``rank`` of ``world_size`` runs: (item index, whether its result is kept). Every rank gets
    ⌈num_items / world_size⌉ passes; a pass past the end runs the last item again and is not kept (padding)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not one of {world_size} ranks")
    passes = -(-num_items // world_size)
    return [(i, True) if (i := rank + k * world_size) < num_items else (num_items - 1, False) for k in range(passes)]


def reassemble(per_rank: Sequence[Sequence[T]], num_items: int) -> list[T]:
    """Item order from each rank's kept results (rank r's k-th kept result is item r + k·N)."""
    world_size = len(per_rank)
    return [per_rank[i % world_size][i // world_size] for i in range(num_items)]


def gather_objects(value: object) -> list:
    """Every rank's ``value``, in rank order (pickled through ``all_gather_object``)."""
    gathered: list = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, value)
    return gathered


def sharded_map(num_items: int, run: Callable[[int], T]) -> list[T]:
    """``[run(i) for i in range(num_items)]``, each item run by one rank when torch.distributed is initialized
    with several processes; every process must call it with the same ``num_items`` (a collective). ``run`` must
    return a picklable value when sharded."""
    if not (torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1):
        return [run(i) for i in range(num_items)]
    if num_items == 0:  # every rank knows it: nothing runs, nothing to exchange
        return []
    rank, world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
    kept = []
    for index, keep in rank_schedule(num_items, rank, world_size):
        result = run(index)
        if keep:
            kept.append(result)
    return reassemble(gather_objects(kept), num_items)
