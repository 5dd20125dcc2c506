"""The Multi-LoRA linear layer: h = W0·x + (α/r)·B_{slot(x)}·A·x, routed per row in mixed batches.

PEFT routes mixed batches only at inference (``adapter_names=``) and loops over adapters; here A·x is computed
once for the whole batch and every row's own B is applied by one batched matrix product, so a mixed batch
trains all tasks at once. The layout is PEFT's: ``lora_A`` (r × in) is the input side, ``lora_B.weight[i]``
(out × r) the output side of adapter slot i. A slot is a task (``route_by="task"``, the default) or a loss
objective (``route_by="objective"``), read from the rows' :func:`~mtft.core.rows.labelled_rows` declaration.
"""

from __future__ import annotations

import math
from typing import Any, Literal, Optional, Sequence, Union

import torch
from torch import nn

from mtft.core.per_objective import Products, Segments, grouped
from mtft.core.rows import row_labels


class RoutedLoraB(nn.Module):
    """The stacked output sides B (slots × out × r); row n of a batch is multiplied by B[slots[n]].

    A module of its own so that per-objective gradient hooks see its input (A·x after dropout) and the rows'
    slots, exactly as they see a Linear layer's input; it computes its own per-objective products (the three
    ``per_objective_*`` methods: :class:`mtft.core.per_objective.PerObjectiveLayer`)."""

    def __init__(self, num_slots: int, out_features: int, r: int, device=None, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(num_slots, out_features, r, device=device, dtype=dtype))

    def forward(self, shared: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        rows = shared.shape[0]
        per_row = self.weight.index_select(0, slots)  # (N, out, r)
        out = torch.bmm(shared.reshape(rows, -1, shared.shape[-1]), per_row.transpose(1, 2))
        return out.reshape(*shared.shape[:-1], self.weight.shape[1])

    # -- per-objective gradients (mtft.core.per_objective.PerObjectiveLayer) ----------------------------------------
    def per_objective_input(self, inputs: tuple[Any, ...], output: torch.Tensor) -> tuple[Any, int]:
        """A·x and the slot of every row."""
        return (inputs[0].detach(), inputs[1].detach()), 0

    def per_objective_row_sparse(self) -> Sequence[nn.Parameter]:
        """Only the B's of the slots in the batch get a gradient."""
        return [self.weight]

    def per_objective_products(self, saved: Any, segments: Segments, grad: torch.Tensor, out: Products) -> None:
        """∂L_t/∂B[j] = Σ_{n∈t, slot(n)=j} δ_nᵀ (A·x_n), A frozen: only the rows' own B's. When each objective's rows
        share one slot (objectives within one task, the usual case), one batched product per distinct row count
        (:class:`~mtft.core.per_objective.RowGroups`); objectives spanning slots go one (objective, slot) at a time."""
        if not segments:
            return
        shared, slots = saved
        buffer = out.rows(self.weight)
        groups = grouped(segments, slots.shape[0], slots.device)
        slot_of_segment = torch.zeros(len(groups.objectives), dtype=slots.dtype, device=slots.device)
        slot_of_segment[groups.segment_of_row] = slots  # any row's slot; all of them when each segment has one
        if bool((slot_of_segment[groups.segment_of_row] == slots).all()):
            places = buffer.slots(slot_of_segment)  # may grow the store: its shape is read after
            store = buffer.store.view(-1, *buffer.store.shape[2:])
            for bucket in groups.buckets:
                products = torch.bmm(bucket.stack(grad).transpose(1, 2), bucket.stack(shared))
                at = bucket.segments.to(places.device)
                index = bucket.objectives.to(places.device) * buffer.store.shape[1] + places[at]
                store.index_add_(0, index, products.to(out.dtype))
            return
        for t, rows in segments:
            row_slots = slots[rows]
            for j in torch.unique(row_slots).tolist():
                own = rows if bool((row_slots == j).all()) else _select(rows, row_slots == j)
                g = grad[own].reshape(-1, grad.shape[-1])
                a_x = shared[own].reshape(-1, shared.shape[-1])
                slot = int(buffer.slots(torch.tensor([j], device=slots.device))[0])
                buffer.store[t, slot].addmm_(g.t().to(out.dtype), a_x.to(out.dtype))

    def extra_repr(self) -> str:
        k, out, r = self.weight.shape
        return f"slots={k}, out={out}, r={r}"


def _select(rows: Union[slice, torch.Tensor], keep: torch.Tensor) -> torch.Tensor:
    """The rows of a segment (slice or index tensor) where ``keep`` holds."""
    index = torch.arange(rows.start, rows.stop, device=keep.device) if isinstance(rows, slice) else rows
    return index[keep]


class MultiLoraLinear(nn.Module):
    def __init__(
        self,
        base: nn.Linear,
        num_adapters: int,
        r: int,
        alpha: float,
        dropout: float,
        init_a: str,
        generator: Optional[torch.Generator] = None,
        route_by: Literal["task", "objective"] = "task",
    ):
        super().__init__()
        self.base_layer = base
        base.requires_grad_(False)
        device, dtype = base.weight.device, base.weight.dtype
        # A is a frozen *parameter* (not a buffer) so that it is saved in every checkpoint with the model.
        self.lora_A = nn.Parameter(torch.empty(r, base.in_features, device=device, dtype=dtype), requires_grad=False)
        self.lora_B = RoutedLoraB(num_adapters, base.out_features, r, device=device, dtype=dtype)
        self.scaling = alpha / r
        self.route_by = route_by
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        if device.type != "meta":
            self._init_a(init_a, generator)

    @torch.no_grad()
    def _init_a(self, init_a: str, generator: Optional[torch.Generator]) -> None:
        if init_a == "gaussian":  # Algorithm 1 of the paper: i.i.d. N(0, 1)
            self.lora_A.normal_(0.0, 1.0, generator=generator)
        else:  # PEFT's default for lora_A: kaiming_uniform_(a=√5), i.e. U(-1/√in, 1/√in)
            bound = 1.0 / math.sqrt(self.lora_A.shape[1])
            self.lora_A.uniform_(-bound, bound, generator=generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base_layer(x)
        slots = row_labels(self.route_by, "MultiLoraLinear", x.shape[0])  # each row's adapter: whose B applies
        shared = nn.functional.linear(self.dropout(x), self.lora_A)  # A·x once for every task: (N, ..., r)
        return out + self.scaling * self.lora_B(shared, slots)

    def extra_repr(self) -> str:
        return (
            f"in={self.lora_A.shape[1]}, r={self.lora_A.shape[0]}, scaling={self.scaling:g}, route_by={self.route_by}"
        )
