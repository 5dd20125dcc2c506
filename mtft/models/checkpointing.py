"""Activation (gradient) checkpointing of the encoder's layers: Transformers' own, non-reentrant.

Each of the encoder's layers (Transformers' ``GradientCheckpointingLayer``) then keeps only its input in the forward
pass and runs its forward again when the backward pass reaches it. The per-objective gradients need every trainable
layer's input: :func:`recomputed_modules` names the layers whose forward calls are recomputed, so that the
gradient engine takes their inputs from the recomputation instead of holding them from the first pass
(:attr:`mtft.gradients.PerObjectiveGradients.recomputed`).
"""

from __future__ import annotations

from torch import nn
from transformers.modeling_layers import GradientCheckpointingLayer

from mtft.core.errors import ConfigError
from mtft.core.rows import rows_for_recomputation


def enable_checkpointing(encoder: nn.Module) -> None:
    """Non-reentrant checkpointing of every layer (the reentrant variant would hide the layers' parameters from the
    autograd graph of the per-objective pass, and needs inputs that require gradients)."""
    base = getattr(encoder, "get_base_model", lambda: encoder)()  # a PEFT model: the Transformers model inside
    if not getattr(base, "supports_gradient_checkpointing", False):
        raise ConfigError(
            f"training.gradient_checkpointing: the encoder ({type(base).__name__}) does not support Transformers' "
            "gradient checkpointing"
        )
    # the recomputation declares the rows' labels again (Multi-LoRA routes by them; mtft.core.rows)
    kwargs = {"use_reentrant": False, "context_fn": rows_for_recomputation}
    enable = getattr(base, "activation_checkpointing_enable", None)  # the name from Transformers 5.2x on
    if enable is not None:
        enable(activation_checkpointing_kwargs=kwargs)
    else:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def recomputed_modules(model: nn.Module) -> set[nn.Module]:
    """The modules whose forward calls run again in the backward pass: those inside a checkpointed layer (the layer
    itself not: Transformers checkpoints its ``forward``, so hooks on the layer run once)."""
    out: set[nn.Module] = set()
    for module in model.modules():
        if isinstance(module, GradientCheckpointingLayer) and module.gradient_checkpointing:
            out.update(m for m in module.modules() if m is not module)
    return out
