"""Which layer computes which per-objective products: torch's built-in layers here, any other layer itself.

:class:`~mtft.gradients.PerObjectiveGradients` keeps each layer's input in a forward hook and receives the
gradient of its output δ in the backward pass; what it then writes per objective t is the layer's own business:

    Linear:     ∂L_t/∂W = Σ_{n∈t} δ_nᵀ x_n          ∂L_t/∂b = Σ_{n∈t} δ_n
    Embedding:  ∂L_t/∂E[i] = Σ_{n∈t, positions with id i} δ_n     (the padding row gets none)
    LayerNorm:  ∂L_t/∂γ = Σ_{n∈t} δ_n ⊙ x̂_n        ∂L_t/∂β = Σ_{n∈t} δ_n

The rules for these three torch layers live here. A layer of any other type that holds trainable parameters
provides its own by implementing :class:`PerObjectiveLayer` -- three methods, matched by name, so that the layer's
module imports nothing from here (Multi-LoRA's ``RoutedLoraB`` in ``mtft/adapters/multi_lora/layer.py`` and the
MHLoss heads' ``MultiLinear`` in ``mtft/models/multihead.py`` do so; so can a layer defined outside mtft). The
products are written through :class:`Products`, which the collector implements.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence, Union, runtime_checkable

import torch
from torch import nn

from mtft.gradients.row_sparse import RowSparseBuffer

# (objective, its rows): a slice when the batch is sorted by objective, else an index tensor.
Segments = Sequence[tuple[int, Union[slice, torch.Tensor]]]


class Products(Protocol):
    """Where a layer writes its per-objective products (implemented by
    :class:`~mtft.gradients.PerObjectiveGradients`): a dense parameter's by :meth:`write` / :meth:`write_product`
    (the first write of a step overwrites, later ones add), a row-sparse parameter's into the slots of its
    :meth:`rows` buffer."""

    dtype: torch.dtype

    def trains(self, param: torch.Tensor) -> bool:
        """Whether ``param`` is one of the collected (trainable) parameters."""
        ...

    def write(self, param: torch.Tensor, t: int, value: torch.Tensor) -> None: ...

    def write_product(self, param: torch.Tensor, t: int, a: torch.Tensor, b: torch.Tensor) -> None:
        """Objective t's gradient of ``param`` gets ``a @ b`` (written straight into the buffer)."""
        ...

    def rows(self, param: torch.Tensor) -> RowSparseBuffer:
        """The buffer of a row-sparse parameter: ``slots(index)`` gives each touched row its slot in ``store[t]``."""
        ...


@runtime_checkable
class PerObjectiveLayer(Protocol):
    """A layer that computes its own per-objective products (any ``nn.Module`` with these three methods)."""

    def per_objective_input(self, inputs: tuple[Any, ...], output: torch.Tensor) -> tuple[Any, int]:
        """What the products need from a forward call (``inputs``: its positional arguments), detached, and the
        dimension of ``output`` that holds the batch's rows (0 unless the layer stacks something before them)."""
        ...

    def per_objective_products(self, saved: Any, segments: Segments, grad: torch.Tensor, out: Products) -> None:
        """Write every present objective's gradient of the layer's trainable parameters into ``out``:
        ``grad`` is δ, the gradient of the layer's output; ``segments`` says which rows are whose."""
        ...

    def per_objective_row_sparse(self) -> Sequence[nn.Parameter]:
        """The parameters whose gradient touches only some rows of their first dimension (an embedding's looked-up
        tokens): their buffers keep the touched rows only (:class:`~mtft.gradients.row_sparse.RowSparseBuffer`)."""
        ...


def _linear(module: nn.Linear, x: torch.Tensor, segments: Segments, grad: torch.Tensor, out: Products) -> None:
    for t, rows in segments:
        g = grad[rows].reshape(-1, grad.shape[-1])
        if out.trains(module.weight):
            out.write_product(module.weight, t, g.t(), x[rows].reshape(-1, x.shape[-1]))
        if module.bias is not None and out.trains(module.bias):
            out.write(module.bias, t, g.sum(0))


def _embedding(module: nn.Embedding, ids: torch.Tensor, segments: Segments, grad: torch.Tensor, out: Products) -> None:
    for t, rows in segments:
        index, g = ids[rows].reshape(-1), grad[rows].reshape(-1, grad.shape[-1])
        if module.padding_idx is not None:  # nn.Embedding gives the padding row no gradient
            keep = index != module.padding_idx
            index, g = index[keep], g[keep]
        buffer = out.rows(module.weight)
        slots = buffer.slots(index)
        buffer.store[t].index_add_(0, slots, g.to(out.dtype))


def _layer_norm(module: nn.LayerNorm, x: torch.Tensor, segments: Segments, grad: torch.Tensor, out: Products) -> None:
    has_weight = module.weight is not None and out.trains(module.weight)
    normalised = nn.functional.layer_norm(x, module.normalized_shape, eps=module.eps) if has_weight else None
    width = int(torch.tensor(module.normalized_shape).prod())
    for t, rows in segments:
        g = grad[rows].reshape(-1, width)
        if has_weight:  # then normalised is a tensor
            out.write(module.weight, t, (g * normalised[rows].reshape(-1, width)).sum(0))  # type: ignore[index]
        if module.bias is not None and out.trains(module.bias):
            out.write(module.bias, t, g.sum(0))


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
