"""The cache of the masked-LM stages that run before fine-tuning -- ``pretrain.before_finetune``
(:mod:`mtft.training.pretrain`) and SURT (:mod:`mtft.training.surt`): one recipe for the key of an entry and one
way to fill it, so that the two stages cannot drift apart in what they key on or how runs share an entry.

What keys an entry is everything that changes the checkpoint. Each stage names its own inputs (texts, settings,
backbone); :func:`stage_key` adds what of the launch changes the weights for any stage: the process count
(``pretrain.micro_batch_size`` is per process, so N processes take N times the batch for 1/N of the steps over the
same token budget -- another checkpoint), the ZeRO stage (its reduction order changes the weights at round-off),
the precision and the gradient clipping.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path
from typing import Any, Callable

from mtft.config.deepspeed import zero_stage
from mtft.config.run_config import RunConfig
from mtft.core.atomic import MARKER
from mtft.core.distributed import ProcessInfo, barrier
from mtft.core.runlock import waiting_lock
from mtft.reporting.logs import logger


def content_digest(root: Path, names_from: Path, skip: Callable[[Path], bool] = lambda _: False) -> str:
    """A hash of the files under the folder ``root`` (or of the file ``root``), each named by its path relative to
    ``names_from``, in sorted order: what keys a stage on local data or a local backbone by content. ``skip`` leaves
    out a file of the folder by its path relative to ``root``."""
    digest = hashlib.sha256()
    files = (p for p in root.rglob("*") if not skip(p.relative_to(root))) if root.is_dir() else [root]
    for file in sorted(p for p in files if p.is_file()):
        digest.update(str(file.relative_to(names_from)).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()


def launch_parts(config: RunConfig, world_size: int) -> dict[str, Any]:
    """What of the launch and the numerics changes a trained checkpoint, whatever the stage."""
    return {
        "processes": world_size,
        "zero_stage": zero_stage(config),
        "precision": config.training.precision,
        "clipping": config.training.gradient_clipping,
    }


def stage_key(config: RunConfig, world_size: int, parts: dict[str, Any]) -> str:
    """The cache key (24 hex digits) of a stage's checkpoint: a hash of the stage's own ``parts`` and
    :func:`launch_parts`."""
    keyed = {**parts, **launch_parts(config, world_size)}
    return hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:24]


def from_cache_or_fill(folder: Path, proc: ProcessInfo, what: str, fill: Callable[[], None]) -> None:
    """Make the cache entry ``folder`` complete: read from the cache when its completion marker is there, else
    ``fill()`` (on every rank; the stage's checkpoint writer makes the folder complete or leaves it invisible).
    Runs started together (the seeds of a study) share an entry: rank 0 of the first takes the entry's lock and
    trains; rank 0 of every other waits for the lock, and all then find the entry written meanwhile. The other
    ranks of a run follow their rank 0 through a barrier. ``what`` names the entry in the log ("pre-trained
    backbone", "SURT: re-trained backbone")."""
    if (folder / MARKER).is_file():
        logger.info(f"{what} from the cache: {folder}")
        return
    lock = folder.parent / f".{folder.name}.lock"
    holding = waiting_lock(lock, lambda: logger.info(f"{what}: waiting for another run writing {folder}"))
    with holding if proc.is_main else contextlib.nullcontext():
        barrier()
        if (folder / MARKER).is_file():
            logger.info(f"{what} from the cache (written meanwhile): {folder}")
            return
        fill()
