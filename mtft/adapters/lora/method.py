"""``model.adapter.method: lora``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

import torch
from torch import nn

from mtft.adapters.base import AdapterMethod
from mtft.adapters.lora.displacement import PeftLoraDisplacement
from mtft.adapters.lora.model import inject_lora, named_lora_layers
from mtft.adapters.options import LoraOptions
from mtft.adapters.peft_config import peft_lora_config

if TYPE_CHECKING:
    import peft


class PeftLora(AdapterMethod):
    """One PEFT LoRA adapter (A_i, B_i) per task, rows routed to their task's adapter; every task's adapter is
    its own model θ_i = W0 + s·B_i·A_i for the forgetting monitors, and exports as it is."""

    name = "lora"
    Options = LoraOptions
    options: LoraOptions
    # PEFT applies each adapter to a sub-batch of its own rows (x[rows] -> lora_A -> lora_B), so the per-objective
    # gradient hooks, which attribute the rows of a layer's whole input, cannot see them.
    supports_gram = False
    gram_refusal = (
        "which cover PEFT's multi-adapter sub-batches only through multi_lora; use "
        "model.adapter.method=multi_lora, or weighting.method=mean to compare with lora"
    )
    monitors_off = None
    exports_lora = True

    @property
    def routing(self) -> Optional[str]:
        return "task"

    def inject(self, encoder: nn.Module, task_names: list[str], objective_names: list[str], seed: int) -> None:
        config = self.peft_config()
        torch.manual_seed(seed)  # PEFT draws every A from the global generator
        inject_lora(encoder, config, task_names)

    def tracker(
        self, encoder: nn.Module, task_names: Sequence[str], objective_names: Sequence[str]
    ) -> PeftLoraDisplacement:
        return PeftLoraDisplacement(encoder, self.slots(task_names, objective_names))

    def peft_config(self) -> peft.LoraConfig:
        return peft_lora_config(self.options)

    def adapter_weights(
        self, encoder: nn.Module, slot: int, slot_name: str
    ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        return {
            name: (m.lora_A[slot_name].weight, m.lora_B[slot_name].weight) for name, m in named_lora_layers(encoder)
        }
