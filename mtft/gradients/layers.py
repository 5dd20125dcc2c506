"""Which layer computes which per-objective products: torch's built-in layers here, any other layer itself.

:class:`~mtft.gradients.PerObjectiveGradients` keeps each layer's input in a forward hook and receives the
gradient of its output δ in the backward pass; what it then writes per objective t is the layer's own business:

    Linear:     ∂L_t/∂W = Σ_{n∈t} δ_nᵀ x_n          ∂L_t/∂b = Σ_{n∈t} δ_n
    Embedding:  ∂L_t/∂E[i] = Σ_{n∈t, positions with id i} δ_n     (the padding row gets none)
    LayerNorm:  ∂L_t/∂γ = Σ_{n∈t} δ_n ⊙ x̂_n        ∂L_t/∂β = Σ_{n∈t} δ_n

The rules for these three torch layers live here. A layer of any other type that holds trainable parameters
provides its own by implementing :class:`~mtft.core.per_objective.PerObjectiveLayer` -- three methods, matched by
name, typed by the contract in ``mtft.core.per_objective``, so that the layer's module imports nothing from the
engine (Multi-LoRA's ``RoutedLoraB`` in ``mtft/adapters/multi_lora/layer.py`` and the MHLoss heads'
``MultiLinear`` in ``mtft/models/multihead.py`` do so; so can a layer defined outside mtft). The products are
written through :class:`~mtft.core.per_objective.Products`, which the collectors implement.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch import nn

from mtft.core.per_objective import PerObjectiveLayer, Products, Segments, grouped

__all__ = ["BUILTIN", "PerObjectiveLayer", "Products", "Rule", "Segments", "row_sparse_parameters"]


def _linear(module: nn.Linear, x: torch.Tensor, segments: Segments, grad: torch.Tensor, out: Products) -> None:
    if not segments:  # no row of this call is an objective's (a head without rows)
        return
    groups = grouped(segments, grad.shape[0], grad.device)
    if out.trains(module.weight):  # one batched product per distinct row count (mtft.core.per_objective.RowGroups)
        for bucket in groups.buckets:
            out.write_products(module.weight, bucket.objectives, bucket.stack(grad).transpose(1, 2), bucket.stack(x))
    if module.bias is not None and out.trains(module.bias):
        out.write_all(module.bias, groups.objectives, groups.sums(grad))


def _embedding(module: nn.Embedding, ids: torch.Tensor, segments: Segments, grad: torch.Tensor, out: Products) -> None:
    """Every objective's touched rows in one ``index_add_``: token k of objective t adds into slot t × slots + its
    row's slot of the (T, slots, h) store."""
    if not segments:  # no row of this call is an objective's (a head without rows)
        return
    groups = grouped(segments, ids.shape[0], ids.device)
    tokens = ids[0].numel() if ids.shape[0] else 0
    objective = groups.objective_of_row().to(ids.device).repeat_interleave(tokens)
    index, g = ids.reshape(-1), grad.reshape(-1, grad.shape[-1])
    if module.padding_idx is not None:  # nn.Embedding gives the padding row no gradient
        keep = index != module.padding_idx
        index, g, objective = index[keep], g[keep], objective[keep]
    buffer = out.rows(module.weight)
    slots = buffer.slots(index)  # may grow the store: its shape is read after
    store = buffer.store.view(-1, *buffer.store.shape[2:])
    store.index_add_(0, objective * buffer.store.shape[1] + slots, g.to(out.dtype))


def _layer_norm(module: nn.LayerNorm, x: torch.Tensor, segments: Segments, grad: torch.Tensor, out: Products) -> None:
    if not segments:  # no row of this call is an objective's (a head without rows)
        return
    groups = grouped(segments, grad.shape[0], grad.device)
    width = int(torch.tensor(module.normalized_shape).prod())
    g = grad.reshape(grad.shape[0], -1, width)
    if module.weight is not None and out.trains(module.weight):
        normalised = nn.functional.layer_norm(x, module.normalized_shape, eps=module.eps)
        out.write_all(module.weight, groups.objectives, groups.sums(g * normalised.reshape(g.shape)))
    if module.bias is not None and out.trains(module.bias):
        out.write_all(module.bias, groups.objectives, groups.sums(g))


BUILTIN: dict[type[nn.Module], Callable[..., None]] = {
    nn.Linear: _linear,
    nn.Embedding: _embedding,
    nn.LayerNorm: _layer_norm,
}


class Rule:
    """How one layer's per-objective products are computed: its own (:class:`PerObjectiveLayer`) or the built-in
    rule of its torch type (``None``: neither, the layer is not supported)."""

    def __init__(self, module: nn.Module):
        self.module = module
        self.layer = module if isinstance(module, PerObjectiveLayer) else None
        self.builtin = next((rule for kind, rule in BUILTIN.items() if isinstance(module, kind)), None)

    @property
    def supported(self) -> bool:
        return self.layer is not None or self.builtin is not None

    def row_sparse(self) -> Sequence[torch.Tensor]:
        if self.layer is not None:
            return self.layer.per_objective_row_sparse()
        return [self.module.weight] if isinstance(self.module, nn.Embedding) else []

    def saved(self, inputs: tuple[Any, ...], output: torch.Tensor) -> tuple[Any, int]:
        if self.layer is not None:
            return self.layer.per_objective_input(inputs, output)
        return inputs[0].detach(), 0

    def products(self, saved: Any, segments: Segments, grad: torch.Tensor, out: Products) -> None:
        if self.layer is not None:
            self.layer.per_objective_products(saved, segments, grad, out)
        elif self.builtin is not None:
            self.builtin(self.module, saved, segments, grad, out)


def row_sparse_parameters(model: nn.Module) -> set[torch.Tensor]:
    """The trainable parameters whose per-objective gradients keep their touched rows only (an embedding's, the
    Multi-LoRA B's): what :class:`~mtft.gradients.PerObjectiveGradients` gives a row-sparse buffer."""
    out: set[torch.Tensor] = set()
    for module in model.modules():
        rule = Rule(module)
        if rule.supported:
            out.update(p for p in rule.row_sparse() if p.requires_grad)
    return out
