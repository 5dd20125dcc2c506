"""What a run checks before anything heavy starts: no process group, no DeepSpeed, no tokenizer, no model yet.

Every mistake that can be seen in the config, the task files, the local data files or the backbone's location is
reported here as one error line within seconds -- not after the process group and DeepSpeed have started, the
tokenizer has been trained and the model built. What needs the data's rows (a malformed line, a column of the
wrong type, label names) is checked when the data loads, still before the run directory is written.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from mtft.config.bufferless import second_backward_refusal
from mtft.config.deepspeed import check_forgetting, zero_stage
from mtft.config.run_config import RunConfig
from mtft.config.schema import GradientsSection
from mtft.core.errors import CheckpointError, ConfigError
from mtft.data.selection import check_tasks
from mtft.forgetting.corpus import check_corpus_files
from mtft.forgetting.retrieval import check_bitext_files, retrieval_pairs
from mtft.models.backbone import check_backbone
from mtft.reporting.trackers import check_trackers
from mtft.tasks.kinds import head_class
from mtft.training.checkpoint import saved_world_size
from mtft.training.engine import deepspeed_config
from mtft.training.setup import check_mhloss, check_output_dir


def preflight(config: RunConfig) -> Optional[Path]:
    """Check a fine-tuning run (``run.stage: finetune``) and return the checkpoint to resume from (None: step 0)."""
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    deepspeed_config(config, world_size)  # the DeepSpeed JSON and the precision
    check_bufferless_update(config.gradients, world_size, zero_stage(config))
    check_trackers(config.logging.trackers())  # logging.report_to: its libraries installed
    resume_from = check_output_dir(config)
    if resume_from is not None:
        check_world_size(resume_from, world_size)
    # tasks, languages, protocols, settings, metric_for_best, local data files
    selected = check_tasks(config.data, config.evaluation)
    check_mhloss(config.stability.heads, {chosen.name: chosen.task.head for chosen in selected})
    check_backbone(config.model)
    if config.stability.mmr > 0 and not any(head_class(chosen.task.head).classifies for chosen in selected):
        raise ConfigError(
            f"stability.mmr={config.stability.mmr:g} regularises the class centres of classification heads, and "
            f"this run has no sequence-classification task ({', '.join(c.name for c in selected)}); set "
            "stability.mmr=0"
        )
    check_forgetting(config)
    if config.forgetting.enabled or config.pretrain.before_finetune:  # L_p's held-out texts, pre-training's texts
        task_languages = [lang for chosen in selected for lang in chosen.languages]
        languages = config.corpus.languages or list(dict.fromkeys(task_languages))
        check_corpus_files(config.corpus, config.data, languages, pretraining=config.pretrain.before_finetune)
        if config.forgetting.enabled and config.forgetting.retrieval.enabled:
            retrieval = config.forgetting.retrieval
            check_bitext_files(retrieval, config.corpus, config.data, retrieval_pairs(retrieval, languages))
    return resume_from


def check_bufferless_update(gradients: GradientsSection, world_size: int, stage: int) -> None:
    """``gradients.update: backward`` where the bufferless step may be chosen (``none``, or ``auto``): the processes
    and the ZeRO stage of :func:`~mtft.config.bufferless.second_backward_refusal` (the rest is checked on load)."""
    if not gradients.may_update_by_second_backward():
        return
    refusal = second_backward_refusal(processes=world_size, zero3=stage == 3)
    if refusal is not None:
        raise ConfigError(refusal)


def check_world_size(checkpoint: Path, world_size: int) -> None:
    """Refuse, on every rank and before anything loads, to resume a checkpoint with another number of processes:
    the global batch, each rank's data stream and RNG state, and a ZeRO optimizer's partitions all depend on it,
    so a resumed run would silently train another run (or fail half-way on one rank)."""
    saved = saved_world_size(checkpoint)
    if saved != world_size:
        raise CheckpointError(
            f"{checkpoint} was saved by {saved} process(es) and this resume runs {world_size}: the global batch, "
            f"the data order and the optimizer state depend on it; resume with {saved} process(es) "
            f"(e.g. torchrun --nproc_per_node {saved} ... --resume), or start a new run.output_dir"
        )


def preflight_pretrain(config: RunConfig) -> None:
    """Check a pre-training run (``run.stage: pretrain``)."""
    if config.run.resume:
        raise ConfigError(
            "run.stage=pretrain cannot resume; its checkpoints are complete Hugging Face folders "
            "to fine-tune or probe, and a new run.output_dir starts it again"
        )
    check_output_dir(config)
    check_backbone(config.model)
    check_corpus_files(config.corpus, config.data, config.corpus.languages, pretraining=True)
