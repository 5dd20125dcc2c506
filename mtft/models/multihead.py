"""MHLoss (Fu, So & Collier, 2023, eq. 10): H linear heads of one shape trained at once on the same features.

The training loss is the mean over the heads of each head's loss, L_MH = 1/(nH) sum_h sum_i l(w_h^T x_i, y_i),
and prediction uses the averaged head w_bar = (1/H) sum_h w_h. The H copies are the *final linear layer*
(``out_proj``) of a pooled head, over the pooled features that all heads share; since that layer is linear, the
averaged head's logits are the mean of the H heads' logits, so the shipped model is an ordinary single head
(:func:`average_heads` turns a state dict holding all H heads into that ordinary head).

Written by hand: neither PyTorch nor Hugging Face has a stack of independent linear layers with a mean-of-losses
objective (``torch.func.stack_module_state`` stacks weights but leaves the loss and the averaged head to us).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
from torch import nn

from mtft.core.per_objective import Products, Segments


class MultiLinear(nn.Module):
    """H linear layers ``in_features -> out_features`` stored as one ``weight`` (H, out, in) and ``bias`` (H, out).

    ``forward(x)`` is the averaged head (what prediction uses); ``forward(x, per_head=True)`` the (H, rows, out)
    logits of every head (what the training loss uses). Both go through ``forward`` so that a ZeRO-3 engine
    gathers the parameters for either.
    """

    def __init__(self, heads: list[nn.Linear]):
        super().__init__()
        self.weight = nn.Parameter(torch.stack([h.weight.detach() for h in heads]).clone())
        self.bias = nn.Parameter(torch.stack([h.bias.detach() for h in heads]).clone())

    @property
    def num_heads(self) -> int:
        return self.weight.shape[0]

    def forward(self, x: torch.Tensor, per_head: bool = False) -> torch.Tensor:
        if per_head:
            return torch.einsum("...i,hoi->h...o", x, self.weight) + self.bias.view(
                self.num_heads, *([1] * (x.dim() - 1)), -1
            )
        return nn.functional.linear(x, self.weight.mean(0), self.bias.mean(0))

    # -- per-objective gradients (mtft.core.per_objective.PerObjectiveLayer) ----------------------------------------
    def per_objective_input(self, inputs: tuple[Any, ...], output: torch.Tensor) -> tuple[Any, int]:
        """The input; the per-head output is (H, rows, out): its rows are the second dimension."""
        return inputs[0].detach(), 1 if output.dim() == inputs[0].dim() + 1 else 0

    def per_objective_row_sparse(self) -> Sequence[nn.Parameter]:
        return []

    def per_objective_products(self, x: torch.Tensor, segments: Segments, grad: torch.Tensor, out: Products) -> None:
        """∂L_t/∂W[h] = Σ_{n∈t} δ_{h,n}ᵀ x_n (δ_h: the gradient of head h's output). ``grad`` is (H, rows, out) for
        the per-head output, or (rows, out) for the averaged head's, whose weight is the mean of the H heads: each
        head then gets 1/H of the ordinary product."""
        heads = self.num_heads
        if grad.dim() == x.dim():  # the averaged head
            grad = (grad / heads).unsqueeze(0).expand(heads, *grad.shape)
        for t, rows in segments:
            g = grad[:, rows].reshape(heads, -1, grad.shape[-1])
            xs = x[rows].reshape(-1, x.shape[-1])
            if out.trains(self.weight):
                out.write(self.weight, t, torch.einsum("hro,ri->hoi", g, xs))
            if out.trains(self.bias):
                out.write(self.bias, t, g.sum(1))

    def averaged(self) -> nn.Linear:
        """The averaged head w_bar as an ordinary ``nn.Linear``."""
        heads, out_features, in_features = self.weight.shape
        linear = nn.Linear(in_features, out_features, device=self.weight.device, dtype=self.weight.dtype)
        with torch.no_grad():
            linear.weight.copy_(self.weight.mean(0))
            linear.bias.copy_(self.bias.mean(0))
        return linear

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, in_features={self.weight.shape[2]}, out_features={self.weight.shape[1]}"


def multi_linear(first: nn.Linear, heads: int) -> MultiLinear:
    """``first`` and ``heads - 1`` more layers of its shape, each with ``nn.Linear``'s own random initialisation
    drawn from the global generator in turn (so the run's seed fixes every head, and they all differ)."""
    layers = [first] + [
        nn.Linear(first.in_features, first.out_features, device=first.weight.device, dtype=first.weight.dtype)
        for _ in range(heads - 1)
    ]
    return MultiLinear(layers)


def average_heads(state: Mapping[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """``state`` (a state dict of ``model``) with every :class:`MultiLinear` replaced by its averaged head, so that
    it loads into the same model built with one head (``out_proj.weight`` (out, in), ``out_proj.bias`` (out))."""
    out = dict(state)
    for name, module in model.named_modules():
        if isinstance(module, MultiLinear):
            for leaf in ("weight", "bias"):
                key = f"{name}.{leaf}"
                if key in out:
                    out[key] = out[key].mean(0)
    return out


def collapse_stacked_heads(
    state: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """``state`` read from a training checkpoint of an MHLoss run (all H heads kept, for an exact resume), made
    to fit a one-head model whose own state dict is ``expected``: a tensor of shape (H, *shape) where the model
    holds ``shape`` at an ``out_proj`` key becomes its mean over the heads."""
    out = dict(state)
    for key, value in state.items():
        target = expected.get(key)
        if (
            target is not None
            and key.rsplit(".", 2)[-2:-1] == ["out_proj"]
            and value.dim() == target.dim() + 1
            and tuple(value.shape[1:]) == tuple(target.shape)
        ):
            out[key] = value.mean(0)
    return out
