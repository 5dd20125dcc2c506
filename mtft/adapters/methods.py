"""The fine-tuning methods a run can choose (``model.adapter.method``) and their parameter table."""

from __future__ import annotations

from torch import nn

from mtft.adapters.multi_lora import MultiLoraConfig, inject_multi_lora
from mtft.config.schema import AdapterSection
from mtft.errors import ConfigError


def apply_method(encoder: nn.Module, adapter: AdapterSection, num_tasks: int, seed: int) -> None:
    """Make ``encoder`` ready for the method: trainable (full), frozen (head) or Multi-LoRA adapted."""
    if adapter.method == "head":
        encoder.requires_grad_(False)
    elif adapter.method == "multi_lora":
        config = MultiLoraConfig(adapter.r, adapter.alpha, adapter.dropout, list(adapter.target_modules),
                                 adapter.init_a)
        try:
            inject_multi_lora(encoder, config, num_tasks, seed)
        except ValueError as error:
            raise ConfigError(f"model.adapter: {error}") from None


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
