"""Build the DeepSpeed engine from what it needs: an :class:`EngineSpec` (optimizer, schedule, DeepSpeed JSON).

The run config owns batch sizes, accumulation, clipping and precision; the DeepSpeed JSON owns ZeRO and
communication settings. A key set in both places is an error rather than a silent precedence rule. Each stage
builds its spec with one function -- :func:`finetuning_engine` (``training`` and the step's batch plan) and
:func:`masked_lm_engine` (``pretrain``'s optimizer and schedule, one micro-batch per step) -- so neither stage
dresses its settings up as the other's.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from transformers import get_scheduler

from mtft.config.deepspeed import read_deepspeed_json, use_bf16
from mtft.config.run_config import RunConfig
from mtft.config.schema import OptimizerSection, SchedulerSection, TrainingSection
from mtft.core.errors import ConfigError


@dataclass(frozen=True)
class EngineSpec:
    """Everything :func:`initialize` builds an engine from."""

    optimizer: OptimizerSection
    scheduler: SchedulerSection
    max_steps: int  # the schedule's length
    deepspeed: dict[str, Any]  # the DeepSpeed JSON with the batch plan, clipping and precision filled in


def finetuning_engine(config: RunConfig, world_size: int) -> EngineSpec:
    """The fine-tuning run's engine: ``training``'s optimizer and schedule, :func:`deepspeed_config`'s JSON."""
    training = config.training
    return EngineSpec(training.optimizer, training.scheduler, training.max_steps, deepspeed_config(config, world_size))


def masked_lm_engine(config: RunConfig, optimizer: OptimizerSection, steps: int, world_size: int) -> EngineSpec:
    """A masked-LM stage's engine (pre-training, SURT): ``optimizer`` (``pretrain``'s, or SURT's learning rate in
    it), ``pretrain``'s schedule over ``steps``, one micro-batch of ``pretrain.micro_batch_size`` per step; the
    DeepSpeed JSON, clipping and precision of ``training``."""
    training = config.training
    ds = _filled(
        read_deepspeed_json(training.deepspeed_config), training, config.pretrain.micro_batch_size, 1, world_size
    )
    return EngineSpec(optimizer, config.pretrain.scheduler, steps, ds)


def deepspeed_config(config: RunConfig, world_size: int) -> dict[str, Any]:
    """The fine-tuning run's DeepSpeed JSON. A step that forms per-objective gradients accumulates the
    micro-batches itself and hands DeepSpeed one combined gradient: its micro-batches are folded into one."""
    training = config.training
    ds = read_deepspeed_json(training.deepspeed_config)
    micro, accumulation = training.micro_batch_size, training.gradient_accumulation_steps
    if config.per_objective_gradients():
        stage = ds.get("zero_optimization", {}).get("stage", 0)
        if stage == 3 and config.gradients.metric == "optimizer":
            # AdamWPreconditioner reads AdamW's v from torch's own state or ZeRO-1/2's flat partitions
            raise ConfigError(
                "gradients.metric=optimizer reads AdamW's state, which ZeRO-3 partitions in a layout it does not "
                f"read; use gradients.metric=euclidean, or ZeRO stage 0, 1 or 2 (not 3, from "
                f"{training.deepspeed_config})"
            )
        micro, accumulation = micro * accumulation, 1
    return _filled(ds, training, micro, accumulation, world_size)


def _filled(
    ds: dict[str, Any], training: TrainingSection, micro: int, accumulation: int, world_size: int
) -> dict[str, Any]:
    """``ds`` (a DeepSpeed JSON) with the batch plan, ``training``'s clipping and precision filled in."""
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


def build_optimizer(model: torch.nn.Module, opt: OptimizerSection) -> torch.optim.Optimizer:
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            # Biases and normalisation weights are conventionally not decayed.
            (no_decay if param.ndim < 2 else decay).append(param)
    groups = [{"params": decay, "weight_decay": opt.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if opt.name == "adamw":
        return torch.optim.AdamW(groups, lr=opt.lr, betas=opt.betas, eps=opt.eps)
    return torch.optim.SGD(groups, lr=opt.lr, momentum=opt.momentum, nesterov=opt.nesterov)


def build_scheduler(optimizer: torch.optim.Optimizer, sched: SchedulerSection, steps: int):
    warmup = sched.warmup_steps if sched.warmup_steps is not None else int(sched.warmup_ratio * steps)
    name = "constant_with_warmup" if sched.name == "constant" else sched.name
    return get_scheduler(name, optimizer, num_warmup_steps=warmup, num_training_steps=steps)


def initialize(model: torch.nn.Module, spec: EngineSpec):
    import deepspeed

    optimizer = build_optimizer(model, spec.optimizer)
    scheduler = build_scheduler(optimizer, spec.scheduler, spec.max_steps)
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=optimizer, lr_scheduler=scheduler, config=spec.deepspeed
    )
    return engine


@contextlib.contextmanager
def deepspeed_patches_undone() -> Iterator[None]:
    """A run's block (start to end) after which the process's ``torch.nn.functional.linear`` is the one it had before.

    A ZeRO-3 engine replaces it with DeepSpeed's memory-efficient linear for the rest of the process ("This will
    persist unless manually reset", ``deepspeed.runtime.zero.partition_parameters``): a second run in the same Python
    (a notebook, a sweep driven from a script) would otherwise compute every linear layer through DeepSpeed's
    autograd function, a ZeRO-3 run's or not. A block inside another one restores what it found."""
    import torch.nn.functional as F

    linear = F.linear
    try:
        yield
    finally:
        F.linear = linear
