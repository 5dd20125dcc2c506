"""``model.adapter.method: multi_lora``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

import torch
from torch import nn

from mtft.adapters.base import AdapterMethod
from mtft.adapters.multi_lora.displacement import MultiLoraDisplacement
from mtft.adapters.multi_lora.layer import MultiLoraLinear
from mtft.adapters.multi_lora.model import inject_multi_lora, multi_lora_layers
from mtft.adapters.options import MultiLoraOptions
from mtft.adapters.peft_config import peft_lora_config

if TYPE_CHECKING:
    import peft


class MultiLora(AdapterMethod):
    """Shared-A Multi-LoRA, one B per task or, with ``granularity: objective``, per loss objective. Every slot's
    B is a block of one stacked parameter, so a Gram counts the blocks that several objectives train."""

    name = "multi_lora"
    Options = MultiLoraOptions
    options: MultiLoraOptions
    monitors_off = None
    exports_lora = True

    @property
    def routing(self) -> Optional[str]:
        return self.options.granularity

    def inject(self, encoder: nn.Module, task_names: list[str], objective_names: list[str], seed: int) -> None:
        slots = len(self.slots(task_names, objective_names))
        inject_multi_lora(encoder, self.options, slots, seed, route_by=self.routing)

    def shared_rows(
        self, model: nn.Module, task_users: Sequence[int], num_objectives: int
    ) -> dict[nn.Parameter, torch.Tensor]:
        """Per layer, the B's of the slots that several objectives train: a task's B when more than one of its
        languages is an objective; with one B per objective, none."""
        users = self.slot_users(task_users, num_objectives)
        return {layer.lora_B.weight: (users > 1).nonzero(as_tuple=True)[0] for layer in multi_lora_layers(model)}

    def tracker(
        self, encoder: nn.Module, task_names: Sequence[str], objective_names: Sequence[str]
    ) -> MultiLoraDisplacement:
        return MultiLoraDisplacement(encoder, self.slots(task_names, objective_names))

    def peft_config(self) -> peft.LoraConfig:
        return peft_lora_config(self.options)

    def adapter_weights(
        self, encoder: nn.Module, slot: int, slot_name: str
    ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """The shared A and the slot's B of every adapted layer: together an ordinary LoRA adapter."""
        return {
            name: (m.lora_A, m.lora_B.weight[slot])
            for name, m in encoder.named_modules()
            if isinstance(m, MultiLoraLinear)
        }
