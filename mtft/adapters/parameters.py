"""How many weights a model stores and trains, by part: the run's log line and report table."""

from __future__ import annotations

from torch import nn


def parameter_table(model: nn.Module) -> list[tuple[str, int, int]]:
    """(part, stored, trainable) rows: the encoder's own weights, the adapters, the heads, and the total."""
    parts = {"encoder weights": [0, 0], "adapters (lora_A, lora_B)": [0, 0], "task heads": [0, 0]}
    for name, param in model.named_parameters():
        part = (
            "task heads"
            if name.startswith("heads.")
            else "adapters (lora_A, lora_B)"
            if ".lora_" in name
            else "encoder weights"
        )
        parts[part][0] += param.numel()
        parts[part][1] += param.numel() if param.requires_grad else 0
    rows = [(part, stored, trainable) for part, (stored, trainable) in parts.items()]
    return rows + [("total", sum(r[1] for r in rows), sum(r[2] for r in rows))]
