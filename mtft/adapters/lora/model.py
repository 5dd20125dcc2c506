"""Plain LoRA (Hu et al., 2021) through PEFT, one adapter (A_i, B_i) per task: the baseline Multi-LoRA is
compared with.

PEFT keeps every task's adapter in its LoRA layers; a mixed batch is routed by handing each layer PEFT's own
``adapter_names`` argument (one adapter name per row), which makes the layer run each adapter on the sub-batch
of its rows. PEFT does that at inference through a forward pre-hook and refuses it in training at the model
level only; the layer-level computation is differentiable, so the same pre-hook, fed from the rows'
:func:`~mtft.core.rows.labelled_rows` declaration, trains all tasks of a mixed batch.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Sequence

from torch import nn

from mtft.core.rows import row_labels

if TYPE_CHECKING:
    import peft
    from peft.tuners.lora import LoraLayer

# PEFT is imported where a model is adapted or read, not with the module (mtft.adapters.peft_config says why).


def inject_lora(encoder: nn.Module, config: peft.LoraConfig, task_names: Sequence[str]) -> list[str]:
    """Freeze ``encoder``, add one PEFT LoRA adapter per task (named after it), and route rows to their task's
    adapter. Returns the adapted layer names; an empty match is an error."""
    import peft

    encoder.requires_grad_(False)
    with warnings.catch_warnings():  # PEFT warns that a second adapter is added "knowingly": it is
        warnings.filterwarnings("ignore", message="Already found a `peft_config`")
        for name in task_names:
            encoder = peft.inject_adapter_in_model(config, encoder, adapter_name=name)
    layers = named_lora_layers(encoder)
    if not layers:
        raise ValueError(f"adapter.target_modules={config.target_modules!r} matches no layer of the encoder")
    names = list(task_names)
    for _, layer in layers:
        for adapter in names:
            layer.lora_A[adapter].requires_grad_(True)
            layer.lora_B[adapter].requires_grad_(True)
        layer.register_forward_pre_hook(_router(names), with_kwargs=True)
    return [name for name, _ in layers]


def _router(task_names: list[str]):
    def route(module: nn.Module, args: tuple, kwargs: dict):
        x = args[0] if args else kwargs["x"]
        tasks = row_labels("task", "LoRA layer", x.shape[0]).tolist()
        return args, {**kwargs, "adapter_names": [task_names[t] for t in tasks]}

    return route


def named_lora_layers(model: nn.Module) -> list[tuple[str, LoraLayer]]:
    """PEFT's LoRA layers of ``model``, with their names."""
    from peft.tuners.lora import LoraLayer

    return [(name, m) for name, m in model.named_modules() if isinstance(m, LoraLayer)]


def lora_layers(model: nn.Module) -> list[LoraLayer]:
    return [m for _, m in named_lora_layers(model)]
