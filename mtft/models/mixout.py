"""Mixout (Lee, Cho & Kang, 2020, "Mixout: Effective regularization to finetune large-scale pretrained language
models", eq. 3): during training each weight entry of a linear layer is swapped for its pre-trained value u with
probability p, and the mix is rescaled so that its expectation is the current weight w:

    w̃ = (M ⊙ w + (1 − M) ⊙ u − p·u) / (1 − p) = u + M ⊙ (w − u) / (1 − p),   M_ij ~ Bernoulli(1 − p),

so ∂w̃/∂w = M / (1 − p) elementwise. In evaluation the layer uses w itself. Written by hand: neither PyTorch,
transformers nor PEFT has Mixout (the authors' reference, github.com/bloodwass/mixout, is not packaged); this
follows its ``mixout`` function and ``MixLinear`` (the bias is not mixed), and its recipe of replacing the
encoder's dropout by Mixout (every ``nn.Dropout`` of the encoder set to p = 0).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class MixoutLinear(nn.Linear):
    """An ``nn.Linear`` whose weight is mixed with its pre-trained value ``target`` (u) while training.

    It keeps the parameter names of the layer it replaces (``weight``, ``bias``), so checkpoints, ZeRO
    partitioning and ``save_pretrained`` see an ordinary linear layer. u is a non-persistent buffer: it is not
    written to checkpoints (a resumed run rebuilds it from the same θ_p before the checkpoint is loaded).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool, p: float, target: torch.Tensor):
        if not 0.0 <= p < 1.0:
            raise ValueError(f"the Mixout probability must be in [0, 1), got {p}")
        super().__init__(in_features, out_features, bias=bias, device="meta")  # weights come from the layer replaced
        self.p = p
        self.register_buffer("target", target.detach().clone(), persistent=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear, p: float) -> "MixoutLinear":
        """A Mixout layer sharing ``linear``'s parameters (the same tensors), with u = their current value."""
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, p, linear.weight)
        layer.weight = linear.weight
        layer.bias = linear.bias
        return layer

    def mixed_weight(self) -> torch.Tensor:
        """w̃ while training (a fresh mask each call), w in evaluation or with p = 0."""
        if not self.training or self.p == 0.0:
            return self.weight
        mask = torch.bernoulli(torch.full_like(self.weight, 1.0 - self.p))
        target = self.target.to(self.weight.dtype)
        return target + mask * (self.weight - target) / (1.0 - self.p)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.linear(input, self.mixed_weight(), self.bias)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, mixout={self.p}"


def apply_mixout(encoder: nn.Module, p: float) -> int:
    """Replace, in place, every trainable ``nn.Linear`` of ``encoder`` by a :class:`MixoutLinear` mixing towards
    its current weights (θ_p when called on the encoder a run starts from), and turn the encoder's dropout off, as
    Lee et al. (2020) replace dropout by Mixout. Frozen layers are left alone (mixing a weight that never moves
    with itself does nothing). Returns the number of layers replaced; ``p = 0`` changes nothing."""
    if p == 0.0:
        return 0
    replaced = 0
    for parent in list(encoder.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Dropout):
                child.p = 0.0
            elif type(child) is nn.Linear and child.weight.requires_grad:
                setattr(parent, name, MixoutLinear.from_linear(child, p))
                replaced += 1
    return replaced
