"""Checkpoints that are either complete or invisible.

A checkpoint is assembled in ``step-N.partial/`` -- model weights as safetensors, the head metadata, the
trainer state (step, sampler, best metric) as JSON, each rank's RNG state, and DeepSpeed's engine state
(optimizer, scheduler) -- then marked ``COMPLETE`` and renamed to ``step-N/`` (:mod:`mtft.core.atomic`). A crash
at any point leaves at most a ``.partial`` folder, which resume ignores and the next save replaces.

What resume trusts: the ``COMPLETE`` marker lists every file of the checkpoint with its size and SHA-256, so a
checkpoint damaged after it was written (a file deleted, truncated or overwritten) is recognised before anything of
it is loaded, and resume falls back to the previous intact checkpoint (:func:`resume_checkpoint`). Nothing is ever
unpickled: DeepSpeed's engine state is read with ``torch.load(weights_only=True)`` (:class:`WeightsOnlyLoads`), so
a pickle planted in ``engine/`` cannot run code -- it fails to load like any other damage.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from safetensors.torch import load_file, save_file

from mtft.core.atomic import MARKER, STAMP, AtomicFolder, is_complete, marker, raise_if_disk_full, write_json
from mtft.core.distributed import barrier
from mtft.core.errors import CheckpointError

ENGINE_TAG = "engine"
_UNLISTED = {MARKER, STAMP}  # the marker holds the manifest; the stamp is removed at commit
_STEP_DIR = re.compile(r"^step-(\d+)$")


def step_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step-{step:08d}"


def full_state_dict(engine) -> dict[str, torch.Tensor]:
    """The whole model's weights on every rank (gathered from the partitions under ZeRO-3)."""
    module = engine.module
    if engine.zero_optimization_stage() == 3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
            # one copy per gathered tensor: tied weights (a masked-LM's decoder and word embeddings) stay one
            # storage, which save_pretrained writes once, as it does from an unpartitioned model
            copies: dict[tuple, torch.Tensor] = {}
            state = {}
            for k, v in module.state_dict().items():
                key = (v.data_ptr(), tuple(v.shape), v.dtype)
                if key not in copies:
                    copies[key] = v.detach().cpu().clone()
                state[k] = copies[key]
            return state
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
    try:
        if rank == 0:
            folder.begin(kind="checkpoint", step=step)
        barrier()
        engine.save_checkpoint(str(partial), tag=ENGINE_TAG, save_latest=False)
        state = full_state_dict(engine)
        save_file(_rng_state(), str(partial / f"rng-rank{rank}.safetensors"))
        barrier()
        if rank == 0:
            write_weights(state, heads, partial)
            write_json(partial / "trainer_state.json", trainer_state)
            # replaces a checkpoint of the same step from an earlier attempt
            folder.commit(kind="checkpoint", step=step, files=file_manifest(partial))
            _prune(run_dir, keep_last)
    except (OSError, RuntimeError) as exc:  # a full disk: no folder that looks complete, one line
        folder.abort()
        raise_if_disk_full(exc, folder.final)
        raise
    barrier()
    return folder.final


def saved_world_size(checkpoint: Path) -> int:
    """How many processes saved ``checkpoint``: recorded in its trainer state, else (a checkpoint from before
    that record) the number of per-rank RNG files, one per process."""
    try:
        recorded = json.loads((checkpoint / "trainer_state.json").read_text(encoding="utf-8")).get("world_size")
    except (OSError, ValueError):
        recorded = None
    if isinstance(recorded, int) and recorded > 0:
        return recorded
    return max(1, len(list(checkpoint.glob("rng-rank*.safetensors"))))


def latest_checkpoint(run_dir: Path) -> Optional[Path]:
    folder = run_dir / "checkpoints"
    if not folder.is_dir():
        return None
    complete = [p for p in folder.iterdir() if _STEP_DIR.match(p.name) and is_complete(p)]
    return max(complete, key=lambda p: int(_STEP_DIR.match(p.name).group(1)), default=None)


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """The run's complete checkpoints, newest first (intact or not: see :func:`damage`)."""
    folder = run_dir / "checkpoints"
    if not folder.is_dir():
        return []
    complete = [p for p in folder.iterdir() if _STEP_DIR.match(p.name) and is_complete(p)]
    return sorted(complete, key=lambda p: int(_STEP_DIR.match(p.name).group(1)), reverse=True)


def file_manifest(folder: Path) -> dict[str, dict[str, Any]]:
    """Size and SHA-256 of every file under ``folder`` (relative POSIX paths), for the completion marker.

    Hashing reads the checkpoint back once at save time (from the page cache, about a second per GB) and once at
    resume; in exchange a file changed after the save -- not only one cut short -- is caught before it is loaded.
    """
    manifest = {}
    for path in sorted(
        p for p in folder.rglob("*") if p.is_file() and p.relative_to(folder).as_posix() not in _UNLISTED
    ):
        manifest[path.relative_to(folder).as_posix()] = {"size": path.stat().st_size, "sha256": _sha256(path)}
    return manifest


def damage(path: Path) -> Optional[str]:
    """Why the complete checkpoint ``path`` cannot be trusted, or None when every file its marker lists is there
    with the recorded size and SHA-256 (a marker from before manifests were recorded: only the files resume reads
    are checked for presence)."""
    files = marker(path).get("files")
    if not isinstance(files, dict):
        needed = ["trainer_state.json", "model.safetensors", ENGINE_TAG]
        missing = [name for name in needed if not (path / name).exists()]
        return f"{missing[0]} is missing" if missing else None
    for name, expected in files.items():
        file = path / name
        if not file.is_file():
            return f"{name} is missing"
        size = file.stat().st_size
        if size != expected.get("size"):
            return f"{name} has {size} bytes, {expected.get('size')} were written"
        if "sha256" in expected and _sha256(file) != expected["sha256"]:
            return f"{name} differs from what was written (SHA-256)"
    return None


def resume_checkpoint(
    engine, run_dir: Path, rank: int, warn: Callable[[str], None] = logging.getLogger("mtft").warning
) -> tuple[Path, dict[str, Any]]:
    """Load the newest intact checkpoint of ``run_dir``: a damaged one (see :func:`damage`, or one that fails to
    load) is skipped with one warning line saying why; when none is left, one :class:`CheckpointError`."""
    candidates = complete_checkpoints(run_dir)
    reasons = []
    for index, path in enumerate(candidates):
        try:
            reason = damage(path)
            if reason is None:
                return path, load_checkpoint(engine, path, rank)
        except CheckpointError as exc:
            reason = str(exc).removeprefix(f"{path}: ")
        reasons.append(f"{path.name}: {reason}")
        after = f"falling back to {candidates[index + 1].name}" if index + 1 < len(candidates) else "none left"
        warn(f"checkpoint {path} is damaged ({reason}); {after}")
    raise CheckpointError(
        f"cannot resume {run_dir}: no intact checkpoint in {run_dir / 'checkpoints'} ({'; '.join(reasons) or 'none'})"
    )


class WeightsOnlyLoads:
    """DeepSpeed's checkpoint engine with its ``load`` replaced by ``torch.load(weights_only=True)``.

    DeepSpeed 0.19's :class:`TorchCheckpointEngine` unpickles the engine state with ``weights_only=False``, which
    runs whatever a planted pickle says; every read of the engine state (model, optimizer, ZeRO partitions) goes
    through ``engine.checkpoint_engine.load``, so replacing that one method closes the hole. The state of ZeRO
    stage 0 with torch optimizers holds only tensors, containers and numbers; ZeRO 1/2's optimizer state adds three
    DeepSpeed classes of plain data (:func:`_safe_globals`), allowed by name. Saving is delegated unchanged.
    """

    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    def load(self, path: str, map_location=None):
        try:
            with torch.serialization.safe_globals(_safe_globals()):
                return torch.load(path, map_location=map_location, weights_only=True)
        except Exception as exc:  # an unpicklable global, a torn zip, a missing file: all mean "cannot use"
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CheckpointError(f"{os.path.basename(path)} cannot be loaded safely ({first[:200]})") from None


def load_checkpoint(engine, path: Path, rank: int) -> dict[str, Any]:
    """Restore engine (weights, optimizer, scheduler) and RNG state; return the trainer state."""
    if not is_complete(path):
        raise CheckpointError(f"{path} is not a complete checkpoint (no {MARKER} marker)")
    try:
        trainer_state = json.loads((path / "trainer_state.json").read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: trainer_state.json is unreadable: {exc}") from None
    if not isinstance(trainer_state, dict) or "step" not in trainer_state:
        raise CheckpointError(f"{path}: trainer_state.json holds no trainer state")
    if not isinstance(engine.checkpoint_engine, WeightsOnlyLoads):
        engine.checkpoint_engine = WeightsOnlyLoads(engine.checkpoint_engine)
    try:
        loaded, _ = engine.load_checkpoint(
            str(path), tag=ENGINE_TAG, load_optimizer_states=True, load_lr_scheduler_states=True
        )
    except CheckpointError as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    except (OSError, RuntimeError, KeyError, ValueError, TypeError) as exc:  # a state of the wrong shape or kind
        raise CheckpointError(f"{path}: DeepSpeed could not load the engine state ({type(exc).__name__})") from None
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


def _safe_globals() -> list:
    """The classes DeepSpeed's ZeRO 1/2 optimizer state pickles besides tensors (found with
    ``torch.serialization.get_unsafe_globals_in_checkpoint``): an enum, the loss scaler's settings, and a dataclass
    of two integers -- data, not code."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [ZeroStageEnum, LossScaler, fragment_address]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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
