"""SURT, self unsupervised re-training (Fu, So & Collier, 2023, §3.3): before fine-tuning, the backbone is re-trained
with masked-LM on the fine-tuning tasks' own training text, labels dropped, and fine-tuning starts from there -- a
start point closer to the fine-tuned weights, which Theorem 2.2 bounds the leave-one-out instability by
(‖w_0 − w_*‖).

It is the masked-LM stage of :mod:`mtft.training.pretrain` on other text: the same packing, dynamic masking,
DeepSpeed loop and Hugging Face checkpoint folder, with ``pretrain``'s optimizer, schedule, block size, micro-batch
and seed (``stability.surt.lr`` may replace the peak rate). The checkpoint is cached under a hash of the backbone's
identity, the texts' content, these settings and the process count, so the seeds of a study re-train once.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Sequence

from mtft.config.paths import cache_dir
from mtft.config.run_config import RunConfig
from mtft.config.schema import ModelSection, OptimizerSection, PretrainSection, SurtSection
from mtft.core.atomic import MARKER
from mtft.core.distributed import ProcessInfo
from mtft.data.pipeline import task_training_texts
from mtft.reporting.logs import logger
from mtft.training.pretrain import Pretraining, quiet_progress
from mtft.training.stage_cache import content_digest, from_cache_or_fill, stage_key

SURT_VERSION = "1"  # bump when re-training changes what it produces, to invalidate cached checkpoints


def surt_optimizer(pretrain: PretrainSection, surt: SurtSection) -> OptimizerSection:
    """The optimizer SURT trains with: ``pretrain.optimizer``, its lr replaced by ``stability.surt.lr`` if set."""
    optimizer, lr = pretrain.optimizer, surt.lr
    return optimizer if lr is None else optimizer.model_copy(update={"lr": lr})


def surt_key(config: RunConfig, texts: Sequence[str], world_size: int = 1) -> str:
    """A hash of everything that determines the re-trained checkpoint: the backbone (Hub id and revision, or a local
    folder's content), the texts, the SURT and masked-LM settings, precision, clipping, processes and ZeRO stage."""
    p = config.pretrain
    mlm = p.model_dump(mode="json", include={"seed", "block_size", "micro_batch_size", "scheduler"})
    parts = {
        "version": SURT_VERSION,
        "backbone": _backbone_identity(config.model),
        "texts": hashlib.sha256("\0".join(texts).encode()).hexdigest(),
        "surt": config.stability.surt.model_dump(mode="json"),
        "mlm": {**mlm, "optimizer": surt_optimizer(p, config.stability.surt).model_dump(mode="json")},
        "block_size": p.block_size or config.data.max_length,
        "mlm_probability": config.corpus.mlm_probability,
    }
    return stage_key(config, world_size, parts)


def _backbone_identity(model: ModelSection) -> dict:
    identity = {"backbone": model.backbone, "revision": model.revision}
    folder = Path(model.backbone)
    if folder.is_dir():  # a local folder (the cached pre-trained tiny one included) is named by its content
        identity = {"folder_content": content_digest(folder, folder, _bookkeeping)}
    return identity


def _bookkeeping(path: Path) -> bool:
    """What mtft writes beside a backbone's own files, which does not change the re-trained checkpoint: the λ_p
    cache the forgetting monitors add to the folder (after a SURT run or before it), the completion marker, and
    pre-training's record (its wall-clock seconds differ between two identical pre-trainings)."""
    return path.parts[0] == "lambda_p" or path.name in (MARKER, "pretrain.json") and len(path.parts) == 1


def surt_backbone(config: RunConfig, model: ModelSection, proc: ProcessInfo) -> ModelSection:
    """``model`` (what fine-tuning would start from, after ``pretrain.before_finetune``) itself, or -- with
    ``stability.surt.enabled`` -- a copy whose ``backbone`` is ``model``'s re-trained on the tasks' training text,
    from the cache or re-trained now (every rank trains, rank 0 writes)."""
    if not config.stability.surt.enabled:
        return model
    quiet_progress()
    config = config.model_copy(update={"model": model})  # the masked-LM stage trains this backbone
    texts = task_training_texts(config.data, config.evaluation.split)
    folder = cache_dir(config.data) / "surt" / surt_key(config, texts, proc.world_size)
    from_cache_or_fill(folder, proc, "SURT: re-trained backbone", lambda: _retrain_into(config, texts, folder, proc))
    return model.model_copy(update={"backbone": str(folder), "revision": None})


def _retrain_into(config: RunConfig, texts: list[str], folder: Path, proc: ProcessInfo) -> None:
    """Re-train the backbone on the tasks' training text into the cache entry ``folder``."""
    optimizer = surt_optimizer(config.pretrain, config.stability.surt)
    pre = Pretraining(config, [], proc, training_texts=texts, optimizer=optimizer)
    tokens = config.stability.surt.tokens
    logger.info(
        f"SURT: re-training the backbone ({config.model.backbone}) with masked-LM on the tasks' training text "
        f"({len(texts)} texts, {len(pre.blocks)} blocks): {tokens:,} tokens, {pre.steps_for(tokens)} steps -> "
        f"{folder}"
    )
    start = time.perf_counter()

    def save(budget, seen, step, _lp, engine):
        meta = {
            "tokens_budget": budget,
            "tokens_seen": seen,
            "steps": step,
            "texts": len(texts),
            "backbone": config.model.backbone,
            "seed": config.pretrain.seed,
            "seconds": time.perf_counter() - start,
        }
        pre.write_checkpoint(folder, engine, meta)
        logger.info(f"SURT: re-trained in {time.perf_counter() - start:.0f} s")

    pre.train(tokens, [tokens], save, log=None)
