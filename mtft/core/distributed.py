"""Process-group set-up for every launch mode.

``torchrun`` and the ``deepspeed`` launcher export RANK/WORLD_SIZE/LOCAL_RANK/MASTER_*; a plain
``python run.py`` exports nothing, so we set up a one-process group on a free local port ourselves.
DeepSpeed then picks its accelerator (CPU here, with gloo) and backend by itself.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ProcessInfo:
    rank: int
    world_size: int
    local_rank: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed() -> ProcessInfo:
    if "RANK" not in os.environ:
        os.environ.update(
            RANK="0",
            LOCAL_RANK="0",
            WORLD_SIZE="1",
            LOCAL_WORLD_SIZE="1",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(_free_port()),
        )
    info = ProcessInfo(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0)))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", info.world_size))
    if local_world > 1 and "OMP_NUM_THREADS" not in os.environ:
        # Several processes on one host each default to all cores; oversubscription makes steps ~90x slower.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    quiet_cpu_accelerator()
    import deepspeed

    if not torch.distributed.is_initialized():
        deepspeed.init_distributed(verbose=False)
    return info


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` over ranks (a copy; no-op on one process)."""
    out = tensor.detach().clone()
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        torch.distributed.all_reduce(out)
    return out


def reduce_scatter(output: torch.Tensor, tensor: torch.Tensor, async_op: bool = False):
    """Sum ``tensor`` over ranks and keep this rank's equal share (``output``: 1/N of ``tensor``'s elements).
    Recent torch (2.13 here) names it ``reduce_scatter_single`` and deprecates ``reduce_scatter_tensor``; gloo
    implements it natively (checked on torch 2.13), so no all-reduce stands in for it."""
    fn = getattr(torch.distributed, "reduce_scatter_single", None) or torch.distributed.reduce_scatter_tensor
    return fn(output, tensor, async_op=async_op)


def all_gather(output: torch.Tensor, tensor: torch.Tensor) -> None:
    """Concatenate every rank's ``tensor`` (equal sizes) into ``output``, in rank order."""
    fn = getattr(torch.distributed, "all_gather_single", None) or torch.distributed.all_gather_into_tensor
    fn(output, tensor)


def barrier() -> None:
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        torch.distributed.barrier()


def quiet_cpu_accelerator() -> None:
    """Without a GPU, name DeepSpeed's CPU accelerator before anything imports DeepSpeed: what it would detect,
    without its "Setting accelerator to CPU ... unable to detect it" warning on every command."""
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
