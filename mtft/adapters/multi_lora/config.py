"""Shared-A Multi-LoRA configuration."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Union

import peft

from mtft.adapters.peft_config import peft_lora_config


@dataclass(frozen=True)
class MultiLoraConfig:
    """One frozen random A (r × in) shared by every task, one trained B (out × r) per task, in each target layer.

    ``init_a``: ``"peft"`` draws A as PEFT does by default (Kaiming-uniform, a = √5) -- what the paper's
    experiments used and the default, because its scale (≈ 1/√in) keeps A·x at the scale of x so the B's train
    at ordinary learning rates; ``"gaussian"`` draws i.i.d. N(0, 1) as in the paper's Algorithm 1, which
    multiplies A·x by ≈ √in and needs a correspondingly smaller learning rate.
    """

    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: Union[list[str], str] = field(default_factory=lambda: ["query", "value"])
    init_a: Literal["peft", "gaussian"] = "peft"

    @property
    def scaling(self) -> float:
        return self.alpha / self.r

    def as_peft(self) -> peft.LoraConfig:
        """The equivalent PEFT LoRA config: used for PEFT's target-module matching rules (and for export)."""
        return peft_lora_config(self.r, self.alpha, self.dropout, self.target_modules)
