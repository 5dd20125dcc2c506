"""Put Multi-LoRA layers into an encoder, choosing target layers by PEFT's own matching rules."""

from __future__ import annotations

import torch
from torch import nn

from mtft.adapters.multi_lora.layer import MultiLoraLinear
from mtft.adapters.options import MultiLoraOptions
from mtft.adapters.peft_config import peft_lora_config


def inject_multi_lora(
    encoder: nn.Module, config: MultiLoraOptions, num_adapters: int, seed: int, route_by: str = "task"
) -> list[str]:
    """Freeze ``encoder`` and replace every targeted ``nn.Linear`` by a :class:`MultiLoraLinear` in place.

    Returns the names of the adapted layers; an empty match is an error (a typo in target_modules would
    otherwise silently train nothing but the heads)."""
    from peft.tuners.tuners_utils import check_target_module_exists  # PEFT when a model is adapted (peft_config)

    peft_config = peft_lora_config(config)
    encoder.requires_grad_(False)
    generator = torch.Generator().manual_seed(seed)
    names = [
        name
        for name, module in encoder.named_modules()
        if isinstance(module, nn.Linear) and check_target_module_exists(peft_config, name)
    ]
    if not names:
        raise ValueError(f"adapter.target_modules={config.target_modules!r} matches no linear layer of the encoder")
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = encoder.get_submodule(parent_name) if parent_name else encoder
        layer = MultiLoraLinear(
            getattr(parent, child),
            num_adapters,
            config.r,
            config.alpha,
            config.dropout,
            config.init_a,
            generator,
            route_by,
        )
        setattr(parent, child, layer)
    return names


def multi_lora_layers(model: nn.Module) -> list[MultiLoraLinear]:
    return [m for m in model.modules() if isinstance(m, MultiLoraLinear)]
