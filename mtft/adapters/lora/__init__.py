"""Plain LoRA through PEFT, one adapter (A_i, B_i) per task."""

from mtft.adapters.lora.displacement import PeftLoraDisplacement
from mtft.adapters.lora.method import PeftLora
from mtft.adapters.lora.model import inject_lora, lora_layers

__all__ = ["PeftLora", "PeftLoraDisplacement", "inject_lora", "lora_layers"]
