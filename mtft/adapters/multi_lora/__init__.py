"""Shared-A Multi-LoRA: one frozen random A per adapted layer shared by all tasks, one trained B per task (or per
loss objective); config, layer, injection (PEFT's folder layout), the method and its displacement tracker."""

from mtft.adapters.multi_lora.config import MultiLoraConfig
from mtft.adapters.multi_lora.displacement import MultiLoraDisplacement
from mtft.adapters.multi_lora.layer import MultiLoraLinear
from mtft.adapters.multi_lora.method import MultiLora
from mtft.adapters.multi_lora.model import inject_multi_lora, multi_lora_layers

__all__ = [
    "MultiLora",
    "MultiLoraConfig",
    "MultiLoraDisplacement",
    "MultiLoraLinear",
    "inject_multi_lora",
    "multi_lora_layers",
]
