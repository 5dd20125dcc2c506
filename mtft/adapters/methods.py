"""The fine-tuning methods a run can choose (``model.adapter.method``) and their parameter table."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from mtft.adapters.lora import inject_lora
from mtft.adapters.multi_lora import MultiLoraConfig, inject_multi_lora
from mtft.config.schema import AdapterSection
from mtft.core.errors import ConfigError


def apply_method(encoder: nn.Module, adapter: AdapterSection, task_names: Sequence[str], num_objectives: int,
                 seed: int) -> None:
    """Make ``encoder`` ready for the method: trainable (full), frozen (head), Multi-LoRA or LoRA adapted."""
    config = multi_lora_config(adapter)
    try:
        if adapter.method == "head":
            encoder.requires_grad_(False)
        elif adapter.method == "multi_lora":
            slots = len(task_names) if adapter.granularity == "task" else num_objectives
            inject_multi_lora(encoder, config, slots, seed, route_by=adapter.granularity)
        elif adapter.method == "lora":
            torch.manual_seed(seed)
            inject_lora(encoder, config.as_peft(), task_names)
    except ValueError as error:
        raise ConfigError(f"model.adapter: {error}") from None


def multi_lora_config(adapter: AdapterSection) -> MultiLoraConfig:
    return MultiLoraConfig(adapter.r, adapter.alpha, adapter.dropout, list(adapter.target_modules), adapter.init_a)


def parameter_table(model: nn.Module) -> list[tuple[str, int, int]]:
    """(part, stored, trainable) rows: the encoder's own weights, the adapters, the heads, and the total."""
    parts = {"encoder weights": [0, 0], "adapters (lora_A, lora_B)": [0, 0], "task heads": [0, 0]}
    for name, param in model.named_parameters():
        part = ("task heads" if name.startswith("heads.") else
                "adapters (lora_A, lora_B)" if ".lora_" in name else "encoder weights")
        parts[part][0] += param.numel()
        parts[part][1] += param.numel() if param.requires_grad else 0
    rows = [(part, stored, trainable) for part, (stored, trainable) in parts.items()]
    return rows + [("total", sum(r[1] for r in rows), sum(r[2] for r in rows))]
