"""Exact per-objective gradients at about the cost of one backward pass.

Every example belongs to exactly one objective, and an encoder never mixes examples (attention, layer norm
and feed-forward layers all act within one sequence). So the gradient of the summed loss with respect to a
layer's *output* for example n is the gradient of n's own objective alone, and the gradient of objective t
with respect to a weight is the sum, over t's examples, of the usual per-example products:

    Linear:     ∂L_t/∂W = Σ_{n∈t} δ_nᵀ x_n          ∂L_t/∂b = Σ_{n∈t} δ_n
    Embedding:  ∂L_t/∂E[i] = Σ_{n∈t, positions with id i} δ_n     (the padding row gets none)
    LayerNorm:  ∂L_t/∂γ = Σ_{n∈t} δ_n ⊙ x̂_n        ∂L_t/∂β = Σ_{n∈t} δ_n

Forward hooks keep each layer's input; a hook on its output receives δ during the backward pass of
Σ_t sum_t; the products are summed per objective into a (T, *shape) buffer per parameter. With the batch
sorted by objective the rows of each objective are one contiguous slice, so a layer costs one matrix product
per present objective -- together the same arithmetic as the ordinary weight gradient, which is skipped (the
forward runs on detached parameters). Libraries for per-sample gradients (Opacus, torch.func) materialise one
gradient per *example*; summing per objective inside the hook is what makes this affordable, hence by hand.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Iterator, Optional

import torch
from torch import nn

_ROW_OBJECTIVES: ContextVar[Optional[torch.Tensor]] = ContextVar("row_objectives", default=None)

SUPPORTED = (nn.Linear, nn.Embedding, nn.LayerNorm)


@contextlib.contextmanager
def objective_rows(objectives: torch.Tensor) -> Iterator[None]:
    """Declare the objective of each row (first dimension) of the modules called inside the block."""
    token = _ROW_OBJECTIVES.set(objectives)
    try:
        yield
    finally:
        _ROW_OBJECTIVES.reset(token)


class PerObjectiveGradients:
    """Accumulates ∂(Σ_{n∈t} loss_n)/∂θ for every objective t and trainable parameter θ of ``model``.

    Buffers live in one flat (T, P) tensor, so that data-parallel ranks all-reduce them in one call.
    """

    def __init__(self, model: nn.Module, num_objectives: int, dtype: Optional[torch.dtype] = None):
        self.num_objectives = num_objectives
        self.names: dict[nn.Parameter, str] = {}
        self.modules: list[nn.Module] = []
        unsupported = []
        for module_name, module in model.named_modules():
            own = [(n, p) for n, p in module.named_parameters(recurse=False) if p.requires_grad]
            if not own:
                continue
            if not isinstance(module, SUPPORTED):
                unsupported.append(f"{module_name} ({type(module).__name__})")
                continue
            self.modules.append(module)
            for n, p in own:
                self.names[p] = f"{module_name}.{n}" if module_name else n
        if unsupported:
            raise ValueError(
                "per-objective gradients cover Linear, Embedding and LayerNorm parameters; these modules hold "
                f"other trainable parameters: {', '.join(unsupported)}"
            )
        params = list(self.names)
        dtype = dtype or (torch.float64 if params and params[0].dtype == torch.float64 else torch.float32)
        sizes = [p.numel() for p in params]
        self.flat = torch.zeros(num_objectives, sum(sizes), dtype=dtype, device=params[0].device if params else None)
        self.views: dict[nn.Parameter, torch.Tensor] = {}
        offset = 0
        for p, size in zip(params, sizes):
            self.views[p] = self.flat[:, offset : offset + size].view(num_objectives, *p.shape)
            offset += size
        self._handles: list = []
        self._active = False

    # ------------------------------------------------------------------------------------------------
    def attach(self) -> "PerObjectiveGradients":
        self._handles = [m.register_forward_hook(self._forward_hook) for m in self.modules]
        return self

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    @contextlib.contextmanager
    def capturing(self) -> Iterator[None]:
        self._active = True
        try:
            yield
        finally:
            self._active = False

    def zero(self) -> None:
        self.flat.zero_()

    # ------------------------------------------------------------------------------------------------
    def _forward_hook(self, module: nn.Module, inputs: tuple, output: torch.Tensor):
        if not self._active:
            return None
        rows = _ROW_OBJECTIVES.get()
        if rows is None:
            raise RuntimeError(f"{type(module).__name__} ran outside objective_rows(); cannot attribute rows")
        if rows.shape[0] != output.shape[0]:
            raise RuntimeError(f"objective_rows has {rows.shape[0]} rows, the module's output {output.shape[0]}")
        if not output.requires_grad:
            # Nothing upstream needs a gradient (frozen embeddings, detached parameters): make the output
            # a leaf so that the backward pass still brings this layer its output gradient.
            output = output.detach().requires_grad_(True)
        saved, segments = inputs[0].detach(), _segments(rows)
        output.register_hook(lambda grad: self._accumulate(module, saved, segments, grad))
        return output

    @torch.no_grad()
    def _accumulate(self, module: nn.Module, x: torch.Tensor, segments, grad: torch.Tensor) -> None:
        if isinstance(module, nn.Linear):
            self._linear(module, x, segments, grad)
        elif isinstance(module, nn.Embedding):
            self._embedding(module, x, segments, grad)
        else:
            self._layer_norm(module, x, segments, grad)

    def _linear(self, module: nn.Linear, x, segments, grad) -> None:
        weight, bias = self._view(module.weight), self._view(module.bias)
        for t, rows in segments:
            g = grad[rows].reshape(-1, grad.shape[-1])
            if weight is not None:
                weight[t] += (g.t() @ x[rows].reshape(-1, x.shape[-1])).to(weight.dtype)
            if bias is not None:
                bias[t] += g.sum(0).to(bias.dtype)

    def _embedding(self, module: nn.Embedding, ids, segments, grad) -> None:
        weight = self._view(module.weight)
        for t, rows in segments:
            index, g = ids[rows].reshape(-1), grad[rows].reshape(-1, grad.shape[-1])
            if module.padding_idx is not None:  # nn.Embedding gives the padding row no gradient
                keep = index != module.padding_idx
                index, g = index[keep], g[keep]
            weight[t].index_add_(0, index, g.to(weight.dtype))

    def _layer_norm(self, module: nn.LayerNorm, x, segments, grad) -> None:
        weight, bias = self._view(module.weight), self._view(module.bias)
        normalised = nn.functional.layer_norm(x, module.normalized_shape, eps=module.eps) if weight is not None else None
        width = int(torch.tensor(module.normalized_shape).prod())
        for t, rows in segments:
            g = grad[rows].reshape(-1, width)
            if weight is not None:
                weight[t] += (g * normalised[rows].reshape(-1, width)).sum(0).view_as(weight[t]).to(weight.dtype)
            if bias is not None:
                bias[t] += g.sum(0).view_as(bias[t]).to(bias.dtype)

    def _view(self, param: Optional[nn.Parameter]) -> Optional[torch.Tensor]:
        return self.views.get(param) if param is not None else None

    # ------------------------------------------------------------------------------------------------
    def named_views(self) -> Iterator[tuple[str, nn.Parameter, torch.Tensor]]:
        for p, view in self.views.items():
            yield self.names[p], p, view

    def scale_objectives(self, factors: torch.Tensor) -> None:
        """Multiply objective t's gradients by ``factors[t]`` (e.g. 1/count_t to turn sums into means)."""
        self.flat.mul_(factors.to(self.flat.dtype).unsqueeze(1))

    def gram(self, params: list[nn.Parameter]) -> torch.Tensor:
        """G_ts = g_tᵀ g_s over ``params``, in float64."""
        gram = torch.zeros(self.num_objectives, self.num_objectives, dtype=torch.float64)
        for p in params:
            flat = self.views[p].reshape(self.num_objectives, -1)
            gram += (flat @ flat.t()).double().cpu()
        return gram

    def combine(self, weights: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
        """Σ_t w_t g_t for every parameter."""
        w = weights.to(self.flat.dtype).to(self.flat.device)
        combined = (w @ self.flat).detach()
        out, offset = {}, 0
        for p in self.views:
            out[p] = combined[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
        return out


def _segments(rows: torch.Tensor) -> list[tuple[int, object]]:
    """(objective, row selector) pairs: contiguous slices when rows are sorted by objective."""
    rows = rows.detach()
    if rows.numel() == 0:
        return []
    values, counts = torch.unique_consecutive(rows, return_counts=True)
    if len(set(values.tolist())) == len(values):  # each objective's rows are contiguous
        out, start = [], 0
        for t, c in zip(values.tolist(), counts.tolist()):
            out.append((t, slice(start, start + c)))
            start += c
        return out
    return [(t, (rows == t).nonzero(as_tuple=True)[0]) for t in torch.unique(rows).tolist()]
