"""Build the DeepSpeed engine: optimizer, schedule, and the DeepSpeed config from the run config.

The run config owns batch sizes, accumulation, clipping and precision; the DeepSpeed JSON owns ZeRO and
communication settings. A key set in both places is an error rather than a silent precedence rule.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import get_scheduler

from mtft.config.deepspeed import read_deepspeed_json, use_bf16
from mtft.config.schema import RunConfig
from mtft.core.errors import ConfigError


def deepspeed_config(config: RunConfig, world_size: int) -> dict[str, Any]:
    training = config.training
    ds = read_deepspeed_json(training.deepspeed_config)
    micro, accumulation = training.micro_batch_size, training.gradient_accumulation_steps
    if config.weighting.per_objective_gradients():
        stage = ds.get("zero_optimization", {}).get("stage", 0)
        if stage == 3 and config.weighting.metric == "optimizer":
            # OptimizerMetric reads AdamW's v from torch's own state or ZeRO-1/2's flat partitions
            raise ConfigError(
                "weighting.metric=optimizer reads AdamW's state, which ZeRO-3 partitions in a layout it does not "
                f"read; use weighting.metric=euclidean, or ZeRO stage 0, 1 or 2 (not 3, from "
                f"{training.deepspeed_config})"
            )
        # The Gram step accumulates the micro-batches itself and hands DeepSpeed one combined gradient.
        micro, accumulation = micro * accumulation, 1
    ds.update(
        train_micro_batch_size_per_gpu=micro,
        gradient_accumulation_steps=accumulation,
        train_batch_size=micro * accumulation * world_size,
        gradient_clipping=training.gradient_clipping or 0.0,
        bf16={"enabled": use_bf16(training)},
    )
    ds.setdefault("zero_allow_untested_optimizer", True)  # we pass torch's own AdamW / SGD
    ds.setdefault("steps_per_print", 10**9)
    ds.setdefault("wall_clock_breakdown", False)
    return ds


def build_optimizer(model: torch.nn.Module, config: RunConfig) -> torch.optim.Optimizer:
    opt = config.training.optimizer
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            # Biases and normalisation weights are conventionally not decayed.
            (no_decay if param.ndim < 2 else decay).append(param)
    groups = [{"params": decay, "weight_decay": opt.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if opt.name == "adamw":
        return torch.optim.AdamW(groups, lr=opt.lr, betas=opt.betas, eps=opt.eps)
    return torch.optim.SGD(groups, lr=opt.lr, momentum=opt.momentum, nesterov=opt.nesterov)


def build_scheduler(optimizer: torch.optim.Optimizer, config: RunConfig):
    sched, steps = config.training.scheduler, config.training.max_steps
    warmup = sched.warmup_steps if sched.warmup_steps is not None else int(sched.warmup_ratio * steps)
    name = "constant_with_warmup" if sched.name == "constant" else sched.name
    return get_scheduler(name, optimizer, num_warmup_steps=warmup, num_training_steps=steps)


def initialize(model: torch.nn.Module, config: RunConfig, world_size: int):
    import deepspeed

    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config)
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=optimizer, lr_scheduler=scheduler, config=deepspeed_config(config, world_size)
    )
    return engine
