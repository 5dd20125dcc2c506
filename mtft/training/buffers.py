"""``gradients.buffers: auto``: the buffered Gram step when its buffers fit, the bufferless one otherwise.

The buffered step (:class:`~mtft.gradients.PerObjectiveGradients`) holds T × P floats (P the trainable dense
parameters; 1/N of them per rank when the ranks shard them) plus T × (touched rows) of the row-sparse weights, and is
the faster when they fit; the bufferless step (:mod:`mtft.gradients.layerwise`) holds none of them, and costs one
more product per layer. The choice compares the buffers' bytes with a budget: ``gradients.budget_gb``, or
half of the memory free once the engine is built -- the GPU's (``torch.cuda.mem_get_info``), on CPU the host's
available memory -- leaving the other half to activations, the tape and the update.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from mtft.gradients import full_numel, full_shape

GIB = 2**30


@dataclass(frozen=True)
class BufferChoice:
    mode: str  # "full", "bfloat16" or "none"
    why: str  # one sentence for the log


def buffer_bytes(
    trainable: list[torch.Tensor],
    row_sparse: set[torch.Tensor],
    num_objectives: int,
    world_size: int,
    tokens_per_step: int,
    element_size: int = 4,
) -> int:
    """The buffered step's per-objective buffers on one process: T × the dense parameters (÷ N: sharded over the
    ranks) and T × the rows a step can touch of each row-sparse weight (at most its tokens) × the row's size."""
    dense = sum(full_numel(p) for p in trainable if p not in row_sparse)
    sparse = 0
    for p in row_sparse:  # ZeRO-3: a partitioned weight's own shape is its placeholder's, its full one ds_shape
        shape = full_shape(p)
        rows = shape[0] if len(shape) else 1
        per_row = full_numel(p) // max(rows, 1)
        sparse += min(rows, tokens_per_step) * per_row
    return num_objectives * (dense // max(world_size, 1) + sparse) * element_size


def free_memory(device: torch.device) -> tuple[int, str]:
    """Bytes free for the step and where that figure comes from."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free, f"the free memory of {torch.cuda.get_device_name(device)}"
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "the host's available memory"
    except OSError:
        pass
    return 0, "no memory figure on this host"


def choose_buffers(
    setting: str, needed: int, budget_gb: Optional[float], device: torch.device, num_objectives: int
) -> BufferChoice:
    """The buffer mode of ``gradients.buffers`` (``auto`` resolved against the budget)."""
    size = f"{describe_bytes(needed)} of per-objective buffers at T = {num_objectives}"
    if setting != "auto":
        kind = "bufferless, layer by layer" if setting == "none" else f"buffered ({size})"
        return BufferChoice(setting, f"{kind}: gradients.buffers={setting}")
    if budget_gb is not None:
        budget, source = int(budget_gb * GIB), f"gradients.budget_gb={budget_gb:g}"
    else:
        free, where = free_memory(device)
        free, ranks = smallest_over_ranks(free, device)
        budget, source = (
            free // 2,
            f"half of {where}" + (f", the smallest of the {ranks} processes'" if ranks > 1 else ""),
        )
    if needed <= budget:
        return BufferChoice("full", f"buffered: auto ({size} fit in the budget of {describe_bytes(budget)}, {source})")
    return BufferChoice("none", f"bufferless: auto ({size} exceed the budget of {describe_bytes(budget)}, {source})")


def smallest_over_ranks(value: int, device: torch.device) -> tuple[int, int]:
    """(the smallest ``value`` of all ranks, how many ranks): every rank of a run must take the same step (a rank
    with the buffered step and one with the bufferless step would wait for each other's collectives forever), so
    ``auto`` decides from the memory of the process with the least."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return value, 1
    ranks = torch.distributed.get_world_size()
    if ranks == 1:
        return value, 1
    where = device if torch.distributed.get_backend() == "nccl" else torch.device("cpu")
    smallest = torch.tensor([value], dtype=torch.int64, device=where)
    torch.distributed.all_reduce(smallest, op=torch.distributed.ReduceOp.MIN)
    return int(smallest.item()), ranks


def describe_bytes(size: int) -> str:
    if size >= GIB:
        return f"{size / GIB:.2f} GiB"
    return f"{size / 2**20:.1f} MiB" if size >= 2**20 else f"{size / 2**10:.1f} KiB"
