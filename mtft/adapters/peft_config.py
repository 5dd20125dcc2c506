"""The PEFT ``LoraConfig`` of the LoRA methods: PEFT's own target-module matching, and what export saves."""

from __future__ import annotations

import peft

from mtft.adapters.options import LoraOptions


def peft_lora_config(options: LoraOptions) -> peft.LoraConfig:
    """The ``peft.LoraConfig`` equivalent to ``options``: PEFT's target-module matching rules, and what export
    saves."""
    o = options
    return peft.LoraConfig(r=o.r, lora_alpha=o.alpha, lora_dropout=o.dropout, target_modules=list(o.target_modules))
