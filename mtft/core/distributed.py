"""Process-group set-up for every launch mode.

``torchrun`` and the ``deepspeed`` launcher export RANK/WORLD_SIZE/LOCAL_RANK/MASTER_*; a plain
``python run.py`` exports nothing, so we set up a one-process group ourselves, on an in-memory store: it has no
peer to meet, so it binds no port. DeepSpeed then picks its accelerator (CPU here, with gloo) by itself.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import time
import warnings
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
    alone = "RANK" not in os.environ  # no launcher: a one-process run
    if alone:
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
    info = ProcessInfo(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0)))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", info.world_size))
    if local_world > 1 and "OMP_NUM_THREADS" not in os.environ:
        # Several processes on one host each default to all cores; oversubscription makes steps ~90x slower.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    quiet_cpu_accelerator()
    quiet_library_noise(info.is_main)
    import deepspeed

    no_shared_memory_op()
    if not torch.distributed.is_initialized():
        if alone:
            _one_process_group()
        # DeepSpeed may print on stdout in every process (its op builds); the first process's lines are enough
        with contextlib.nullcontext() if info.is_main else contextlib.redirect_stdout(io.StringIO()):
            deepspeed.init_distributed(verbose=False)  # takes over a group that exists
    return info


def _one_process_group() -> None:
    """The group of a run without a launcher, on DeepSpeed's backend for the accelerator (gloo on CPU, NCCL on CUDA)
    and an in-memory store. ``env://`` would need a free port, picked here and bound a moment later by the store:
    another process can take it in between (a study starts its runs side by side), and the run then fails with
    "address already in use"."""
    from deepspeed.accelerator import get_accelerator

    backend = get_accelerator().communication_backend_name()
    torch.distributed.init_process_group(backend, store=torch.distributed.HashStore(), rank=0, world_size=1)


def no_shared_memory_op() -> None:
    """DeepSpeed's CPU backend compiles a shared-memory C++ op into torch's extensions cache the first time it starts
    (about two minutes, under a lock file that a process killed during the build leaves behind: every later start on
    the machine then waits on it forever, without a word). The op serves ``inference_all_reduce`` only, which mtft
    never calls -- training's collectives are torch.distributed's -- so it is not built: no build, no lock, on one
    process or several (deepspeed 0.19's ``deepspeed.comm.torch.build_shm_op``; nothing changes where it is absent)."""
    import importlib

    # by its module's name: deepspeed.comm's package namespace re-exports torch itself as ``torch``
    backend = importlib.import_module("deepspeed.comm.torch")
    if hasattr(backend, "build_shm_op"):
        backend.build_shm_op = lambda: None


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


#: warnings that say nothing a user can act on, shown by every process and (ZeRO-3) hundreds of times a run:
#: DeepSpeed 0.19 calls torch.distributed collectives that torch 2.x marks deprecated
_LIBRARY_NOISE = (
    (FutureWarning, r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated"),
)


def quiet_library_noise(is_main: bool) -> None:
    """Keep one copy of what the libraries say: the deprecation notices of :data:`_LIBRARY_NOISE` are dropped in
    every process, and on every process but the first, transformers says only errors -- its warnings (the weight
    loading report of a backbone, identical on each rank since every rank loads the same files) come from rank 0."""
    for category, message in _LIBRARY_NOISE:
        warnings.filterwarnings("ignore", message=message, category=category)
    if not is_main:
        import transformers

        transformers.utils.logging.set_verbosity_error()


def speaks_for_node() -> bool:
    """Whether this process prints a user error: the first process of each node (``LOCAL_RANK`` 0), or any process
    not one of several (``WORLD_SIZE`` unset or 1: a ``LOCAL_RANK`` left in the environment silences nothing).
    mtft's processes run the same program on the same config and files, so a user error is raised alike by every
    process of a node -- printed once, not once per rank; a node whose files differ still speaks through its own
    first process."""
    several = os.environ.get("WORLD_SIZE", "1") not in ("", "1")
    return not several or os.environ.get("LOCAL_RANK", "0") == "0"


def report_to_launcher(message: str) -> None:
    """Hand ``message`` to torchrun's report of the failed processes (its ChildFailedError), which shows for each
    process what the file named by ``TORCHELASTIC_ERROR_FILE`` holds: a process that keeps its error line off the
    console (:func:`speaks_for_node`) still names its error there -- should it be the only one to fail, it is not
    lost. Outside torchrun (no such variable), nothing."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    # torchrun's own format (torch.distributed.elastic.multiprocessing.errors.ErrorHandler.record_exception); its
    # report prints "py_callstack", here the one line instead of a traceback
    info = {"py_callstack": message, "timestamp": str(int(time.time()))}
    with contextlib.suppress(OSError):
        with open(path, "w", encoding="utf-8") as handle:
            json.dump({"message": {"message": message, "extraInfo": info}}, handle)
