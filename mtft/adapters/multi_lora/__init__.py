"""Shared-A Multi-LoRA: one frozen random A per adapted layer shared by all tasks, one trained B per task (or per
loss objective); layer, injection (PEFT's folder layout), the method and its displacement tracker (its options:
:class:`mtft.adapters.options.MultiLoraOptions`)."""

from mtft.adapters.multi_lora.displacement import MultiLoraDisplacement
from mtft.adapters.multi_lora.layer import MultiLoraLinear
from mtft.adapters.multi_lora.method import MultiLora
from mtft.adapters.multi_lora.model import inject_multi_lora, multi_lora_layers

__all__ = [
    "MultiLora",
    "MultiLoraDisplacement",
    "MultiLoraLinear",
    "inject_multi_lora",
    "multi_lora_layers",
]
