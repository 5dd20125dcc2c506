"""Checkpoints that are either complete or invisible.

A checkpoint is assembled in ``step-N.partial/`` -- model weights as safetensors, the head metadata, the
trainer state (step, sampler, best metric) as JSON, each rank's RNG state, and DeepSpeed's engine state
(optimizer, scheduler) -- then marked ``COMPLETE`` and renamed to ``step-N/`` (:mod:`mtft.core.atomic`). A crash
at any point leaves at most a ``.partial`` folder, which resume ignores and the next save replaces.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path
from typing import Any, Optional

import torch
from safetensors.torch import load_file, save_file

from mtft.core.atomic import MARKER, AtomicFolder, is_complete, write_json
from mtft.core.distributed import barrier
from mtft.core.errors import CheckpointError

ENGINE_TAG = "engine"
_STEP_DIR = re.compile(r"^step-(\d+)$")


def step_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step-{step:08d}"


def full_state_dict(engine) -> dict[str, torch.Tensor]:
    """The whole model's weights on every rank (gathered from the partitions under ZeRO-3)."""
    module = engine.module
    if engine.zero_optimization_stage() == 3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
            return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
    return {k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}


def ranks_in_sync(module: torch.nn.Module) -> bool:
    """Whether every rank holds bit-identical parameters (a SHA-256 of their bytes, gathered)."""
    if not (torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1):
        return True
    digest = hashlib.sha256()
    for name, param in module.named_parameters():
        digest.update(name.encode())
        digest.update(param.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    digests = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(digests, digest.hexdigest())
    return len(set(digests)) == 1


def write_weights(state: dict[str, torch.Tensor], heads: dict[str, Any], folder: Path) -> None:
    """Model weights (safetensors) plus the heads' metadata (kind and label names) as JSON."""
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    write_json(folder / "heads.json", heads)


def save_checkpoint(
    engine,
    run_dir: Path,
    step: int,
    trainer_state: dict[str, Any],
    heads: dict[str, Any],
    rank: int,
    keep_last: int,
) -> Path:
    folder = AtomicFolder(step_dir(run_dir, step))
    partial = folder.partial
    if rank == 0:
        folder.begin()
    barrier()
    engine.save_checkpoint(str(partial), tag=ENGINE_TAG, save_latest=False)
    state = full_state_dict(engine)
    save_file(_rng_state(), str(partial / f"rng-rank{rank}.safetensors"))
    barrier()
    if rank == 0:
        write_weights(state, heads, partial)
        write_json(partial / "trainer_state.json", trainer_state)
        folder.commit(kind="checkpoint", step=step)  # replaces a checkpoint of the same step from an earlier attempt
        _prune(run_dir, keep_last)
    barrier()
    return folder.final


def latest_checkpoint(run_dir: Path) -> Optional[Path]:
    folder = run_dir / "checkpoints"
    if not folder.is_dir():
        return None
    complete = [p for p in folder.iterdir() if _STEP_DIR.match(p.name) and is_complete(p)]
    return max(complete, key=lambda p: int(_STEP_DIR.match(p.name).group(1)), default=None)


def load_checkpoint(engine, path: Path, rank: int) -> dict[str, Any]:
    """Restore engine (weights, optimizer, scheduler) and RNG state; return the trainer state."""
    if not is_complete(path):
        raise CheckpointError(f"{path} is not a complete checkpoint (no {MARKER} marker)")
    try:
        trainer_state = json.loads((path / "trainer_state.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}/trainer_state.json is unreadable: {exc}") from None
    loaded, _ = engine.load_checkpoint(
        str(path), tag=ENGINE_TAG, load_optimizer_states=True, load_lr_scheduler_states=True
    )
    if loaded is None:
        raise CheckpointError(f"{path}: DeepSpeed could not load the engine state")
    rng_file = path / f"rng-rank{rank}.safetensors"
    if not rng_file.is_file():
        raise CheckpointError(f"{path} has no RNG state for rank {rank}; resume with the same number of processes")
    rng = load_file(str(rng_file))
    torch.set_rng_state(rng["torch_cpu"])
    if "torch_cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["torch_cuda"])
    return trainer_state


def load_weights(module: torch.nn.Module, folder: Path) -> None:
    """Load ``model.safetensors`` from ``folder`` into ``module`` (strict)."""
    file = folder / "model.safetensors"
    if not file.is_file():
        raise CheckpointError(f"no model.safetensors in {folder}")
    missing, unexpected = module.load_state_dict(load_file(str(file)), strict=False)
    if missing or unexpected:
        raise CheckpointError(
            f"{file} does not fit this model: missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}"
        )


def _rng_state() -> dict[str, torch.Tensor]:
    state = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["torch_cuda"] = torch.cuda.get_rng_state()
    return state


def _prune(run_dir: Path, keep_last: int) -> None:
    folder = run_dir / "checkpoints"
    steps = sorted(
        (p for p in folder.iterdir() if _STEP_DIR.match(p.name)), key=lambda p: int(_STEP_DIR.match(p.name).group(1))
    )
    for old in steps[:-keep_last]:
        shutil.rmtree(old)
