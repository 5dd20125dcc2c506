"""The PEFT ``LoraConfig`` of the LoRA methods: PEFT's own target-module matching, and what export saves."""

from __future__ import annotations

from typing import Sequence, Union

import peft


def peft_lora_config(
    r: int, alpha: float, dropout: float, target_modules: Union[Sequence[str], str]
) -> peft.LoraConfig:
    targets = target_modules if isinstance(target_modules, str) else list(target_modules)
    return peft.LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets)
