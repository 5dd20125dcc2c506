"""A whole, unpartitioned copy of a ZeRO-3 encoder, for the forgetting monitors.

Under DeepSpeed ZeRO-3 a parameter's ``data`` is an empty placeholder outside its module's forward and backward
passes, and every forward pass is a collective. The monitors need more than forward passes: λ_p and the
second-order prediction are Hessian-vector products (a double backward through every weight at once, at θ_p, with
the point's tensors as explicit inputs of ``torch.func.functional_call``), the displacement trackers read θ − θ_p
every step, and the end-of-run probe perturbs the weights on rank 0 alone. None of that can run on partitions, so
under ZeRO-3 the monitors measure a replica: the encoder copied whole, once (frozen weights and all), with its
trainable weights refreshed from the partitions after every optimizer step (one all-gather of the trainable
weights, as many elements as one forward pass gathers). Every rank holds the same replica, so every rank computes
the same numbers, as under ZeRO 0-2.

The price, stated in docs/forgetting.md: the replica plus the trackers' θ_p and θ_k copies are whole on every
rank (3 × the trainable weights + the frozen ones); training's own state (weights, gradients, optimizer state,
per-objective buffers) stays partitioned.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

_HOOK_DICTS = (
    "_forward_pre_hooks",
    "_forward_hooks",
    "_backward_pre_hooks",
    "_backward_hooks",
)


class EncoderReplica:
    """``module``: a plain copy of a ZeRO-3 partitioned ``encoder``; :meth:`refresh` copies its trainable weights
    from the partitions. Every rank must call both (each gathers from every rank)."""

    def __init__(self, encoder: nn.Module):
        import deepspeed

        trainable = [(name, p) for name, p in encoder.named_parameters() if p.requires_grad]
        with deepspeed.zero.GatheredParameters(list(encoder.parameters()), modifier_rank=None):
            self.module = plain_copy(encoder)
        replica = dict(self.module.named_parameters())
        self.source = [p for _, p in trainable]
        self.target = [replica[name] for name, _ in trainable]

    @torch.no_grad()
    def refresh(self) -> None:
        """The replica's trainable weights ← the engine's current ones (gathered from every rank)."""
        import deepspeed

        with deepspeed.zero.GatheredParameters(self.source, modifier_rank=None):
            torch._foreach_copy_(self.target, [p.data for p in self.source])


def plain_copy(module: nn.Module) -> nn.Module:
    """A deep copy of ``module`` (whose parameters are gathered) without DeepSpeed's traces: fresh parameters
    (tied ones stay tied), plain parameter dicts and none of ZeRO-3's module hooks (others, such as a LoRA
    router's, are kept)."""
    replica = copy.deepcopy(module)
    fresh: dict[int, nn.Parameter] = {}
    for sub in replica.modules():
        params: dict[str, nn.Parameter | None] = {}
        for name, p in dict.items(sub._parameters):
            if p is not None and id(p) not in fresh:
                fresh[id(p)] = nn.Parameter(p.data, requires_grad=p.requires_grad)  # deepcopy's own clone
            params[name] = None if p is None else fresh[id(p)]
        sub._parameters = params  # type: ignore[assignment]
        sub.__dict__.pop("_original_parameters", None)
        for hooks_name in _HOOK_DICTS:
            hooks = getattr(sub, hooks_name)
            for key in [k for k, hook in hooks.items() if _is_deepspeed(hook)]:
                del hooks[key]
                sub._forward_hooks_with_kwargs.pop(key, None)
                sub._forward_pre_hooks_with_kwargs.pop(key, None)
                sub._forward_hooks_always_called.pop(key, None)
    return replica


def _is_deepspeed(hook) -> bool:
    return getattr(hook, "__module__", "").startswith("deepspeed")
