"""Shared-A Multi-LoRA (SPEC §2): config, layer, and injection into an encoder (PEFT's folder layout)."""

from mtft.adapters.multi_lora.config import MultiLoraConfig
from mtft.adapters.multi_lora.layer import MultiLoraLinear
from mtft.adapters.multi_lora.model import inject_multi_lora, multi_lora_layers

__all__ = ["MultiLoraConfig", "MultiLoraLinear", "inject_multi_lora", "multi_lora_layers"]
