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

from mtft.config.schema import RunConfig
from mtft.core.errors import ConfigError
from mtft.data.selection import check_tasks
from mtft.forgetting.corpus import check_corpus_files
from mtft.models.backbone import check_backbone
from mtft.training.engine import deepspeed_config
from mtft.training.setup import check_output_dir


def preflight(config: RunConfig) -> Optional[Path]:
    """Check a fine-tuning run (``run.stage: finetune``) and return the checkpoint to resume from (None: step 0)."""
    deepspeed_config(config, int(os.environ.get("WORLD_SIZE", 1)))  # the DeepSpeed JSON and the precision
    resume_from = check_output_dir(config)
    selected = check_tasks(config)  # tasks, languages, protocols, settings, metric_for_best, local data files
    check_backbone(config.model)
    if config.forgetting.enabled or config.pretrain.before_finetune:  # L_p's held-out texts, pre-training's texts
        task_languages = [lang for chosen in selected for lang in chosen.languages]
        languages = config.corpus.languages or list(dict.fromkeys(task_languages))
        check_corpus_files(config, languages, pretraining=config.pretrain.before_finetune)
    return resume_from


def preflight_pretrain(config: RunConfig) -> None:
    """Check a pre-training run (``run.stage: pretrain``)."""
    if config.run.resume:
        raise ConfigError(
            "run.stage=pretrain cannot resume; its checkpoints are complete Hugging Face folders "
            "to fine-tune or probe, and a new run.output_dir starts it again"
        )
    check_output_dir(config)
    check_backbone(config.model)
    check_corpus_files(config, config.corpus.languages, pretraining=True)
