"""The PEFT ``LoraConfig`` of the LoRA methods: PEFT's own target-module matching, and what export saves."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mtft.adapters.options import LoraOptions

if TYPE_CHECKING:
    import peft

# PEFT (and with it transformers, about 3 s) is imported where a model is adapted, not with the module: validating a
# config reads the method's class attributes only (mtft.config.run_config), and --print-config and --plan stay quick.


def peft_lora_config(options: LoraOptions) -> peft.LoraConfig:
    """The ``peft.LoraConfig`` equivalent to ``options``: PEFT's target-module matching rules, and what export
    saves."""
    import peft

    o = options
    return peft.LoraConfig(r=o.r, lora_alpha=o.alpha, lora_dropout=o.dropout, target_modules=list(o.target_modules))
