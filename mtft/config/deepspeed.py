"""The DeepSpeed JSON a run names: read and checked before anything starts, and the precision it resolves to.

The run config owns batch sizes, accumulation, clipping and precision; the DeepSpeed JSON owns ZeRO and
communication settings. A key set in both places is an error rather than a silent precedence rule.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch

from mtft.config.run_config import RunConfig
from mtft.config.schema import TrainingSection
from mtft.core.errors import ConfigError

RUN_CONFIG_OWNS = {
    "train_batch_size": "training.micro_batch_size × gradient_accumulation_steps × processes",
    "train_micro_batch_size_per_gpu": "training.micro_batch_size",
    "gradient_accumulation_steps": "training.gradient_accumulation_steps",
    "gradient_clipping": "training.gradient_clipping",
    "bf16": "training.precision",
    "fp16": "training.precision",
    "optimizer": "training.optimizer",
    "scheduler": "training.scheduler",
}


#: the ZeRO stages by name (``training.deepspeed_config: zero2``), built in so that a run needs no file of the
#: checkout -- from any folder, or an installed mtft; configs/deepspeed/<name>.json holds the same JSON to copy and
#: edit (tests/unit/config/test_config.py keeps them equal)
BUILT_IN: dict[str, dict[str, Any]] = {
    "zero0": {"zero_optimization": {"stage": 0}},
    "zero1": {"zero_optimization": {"stage": 1}},
    "zero2": {
        "zero_optimization": {"stage": 2, "overlap_comm": False, "contiguous_gradients": True, "reduce_scatter": True}
    },
    "zero3": {
        "zero_optimization": {
            "stage": 3,
            "overlap_comm": False,
            "contiguous_gradients": True,
            "reduce_scatter": True,
            "stage3_gather_16bit_weights_on_model_save": True,
        }
    },
}


def read_deepspeed_json(path: str) -> dict[str, Any]:
    """The DeepSpeed JSON of ``training.deepspeed_config``: a file, or a built-in ZeRO stage by name."""
    file = Path(path)
    if not file.is_file():
        if path in BUILT_IN:
            return copy.deepcopy(BUILT_IN[path])
        raise ConfigError(
            f"training.deepspeed_config: file not found: {path} (or name a built-in stage: {', '.join(BUILT_IN)})"
        )
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: malformed JSON (line {exc.lineno}): {exc.msg}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a DeepSpeed config must be a JSON object")
    clashes = sorted(set(data) & set(RUN_CONFIG_OWNS))
    if clashes:
        owners = "; ".join(f"{k} comes from {RUN_CONFIG_OWNS[k]}" for k in clashes)
        raise ConfigError(f"{path}: remove {', '.join(clashes)} from the DeepSpeed JSON ({owners})")
    return data


def use_bf16(training: TrainingSection) -> bool:
    supported = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if training.precision == "bf16" and not supported:
        raise ConfigError("training.precision=bf16 needs a GPU with bf16 support; use auto or fp32 here")
    return training.precision == "bf16" or (training.precision == "auto" and supported)


def zero_stage(config: RunConfig) -> int:
    """The ZeRO stage of the run's DeepSpeed JSON (0 when it sets none)."""
    return int(read_deepspeed_json(config.training.deepspeed_config).get("zero_optimization", {}).get("stage", 0))


def check_forgetting(config: RunConfig) -> None:
    """The forgetting monitors' settings that the DeepSpeed configuration rules out. Config-only (the resolved
    config and the JSON's ZeRO stage), so that a run's preflight and a study's check of every cell, which may not
    import the monitors, both refuse them before anything starts."""
    cfg = config.forgetting
    if not cfg.enabled:
        return
    stage = zero_stage(config)
    if stage == 3 and cfg.regularization > 0:
        raise ConfigError(
            "forgetting.regularization adds λ(θ − θ_p) to each weight's gradient through a hook, which ZeRO-3's "
            f"partitioned gradients bypass; use ZeRO stage 0-2 (not 3, from {config.training.deepspeed_config}) "
            "or forgetting.regularization=0"
        )
    if cfg.budget is not None and cfg.budget.action == "scale" and (stage > 0 or use_bf16(config.training)):
        raise ConfigError(
            "forgetting.budget.action=scale edits the weights the optimizer steps, which needs "
            "ZeRO stage 0 in fp32; use action=stop here"
        )
