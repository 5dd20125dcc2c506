"""The contract between a layer and the per-objective gradient engine, and the rows' grouping both use.

The engine (``mtft.gradients``) keeps each trainable layer's input in a forward hook and receives the gradient of
its output δ in the backward pass; the layer's rule writes every objective's products through :class:`Products`.
torch's Linear, Embedding and LayerNorm have their rules in ``mtft.gradients.layers``; any other layer implements
:class:`PerObjectiveLayer`. Both live here, below every package, so that a layer's module (Multi-LoRA's routed B's in
``mtft.adapters``, the MHLoss heads in ``mtft.models``, a layer outside mtft) can type its methods without importing
the engine.

The rows of a layer call come as :data:`Segments`, (objective, rows) pairs. Formed one objective at a time, a
layer's products cost T small matrix products, T bias sums, T LayerNorm products and T embedding index-adds per
call: at T = 48 thousands of small calls a step, which cost more than their arithmetic (on a GPU each is also a
kernel launch). :class:`RowGroups` groups them: the objectives with the same number of rows form one batch, so a
Linear's products are one ``torch.bmm`` per distinct row count (one in all when every objective has as many rows,
e.g. one sequence each at the paper's T = 48), and a sum over each objective's rows is one ``index_add_``
whatever T.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Protocol, Sequence, Union, runtime_checkable

import torch
from torch import nn

# (objective, its rows): a slice when the batch is sorted by objective, else an index tensor.
Segments = Sequence[tuple[int, Union[slice, torch.Tensor]]]


class RowStore(Protocol):
    """A row-sparse parameter's per-objective buffer: ``store[t, slot]`` holds objective t's gradient of the row
    that ``slots`` gives that slot."""

    store: torch.Tensor

    def slots(self, rows: torch.Tensor) -> torch.Tensor: ...


class Products(Protocol):
    """Where a layer writes its per-objective products (implemented by the gradient engine's collectors,
    ``mtft.gradients``): a dense parameter's by :meth:`write`, :meth:`write_product` or :meth:`write_all` (the
    first write of a step overwrites, later ones add), a row-sparse parameter's into the slots of its :meth:`rows`
    buffer."""

    dtype: torch.dtype

    def trains(self, param: torch.Tensor) -> bool:
        """Whether ``param`` is one of the collected (trainable) parameters."""
        ...

    def write(self, param: torch.Tensor, t: int, value: torch.Tensor) -> None: ...

    def write_product(self, param: torch.Tensor, t: int, a: torch.Tensor, b: torch.Tensor) -> None:
        """Objective t's gradient of ``param`` gets ``a @ b`` (written straight into the buffer)."""
        ...

    def write_all(self, param: torch.Tensor, objectives: torch.Tensor, values: torch.Tensor) -> None:
        """Objective ``objectives[i]``'s gradient of ``param`` gets ``values[i]``, for every i at once."""
        ...

    def write_products(self, param: torch.Tensor, objectives: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
        """Objective ``objectives[i]``'s gradient of ``param`` gets ``a[i] @ b[i]`` (a batched product, written
        straight into the buffer where it can be)."""
        ...

    def rows(self, param: torch.Tensor) -> RowStore:
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
        tokens): their buffers keep the touched rows only (``mtft.gradients.row_sparse.RowSparseBuffer``)."""
        ...


@dataclass(frozen=True)
class Bucket:
    """Objectives with the same number of rows: their ids (``objectives``), their places among the call's
    segments (``segments``) and their rows, objective after objective (``rows``; ``None`` when that is the whole
    call in order, so that stacking is a view)."""

    objectives: torch.Tensor
    segments: torch.Tensor
    rows: Optional[torch.Tensor]
    length: int

    def stack(self, a: torch.Tensor) -> torch.Tensor:
        """(objectives, length × tokens, features): each objective's rows of ``a`` (rows first), tokens flattened."""
        picked = a if self.rows is None else a.index_select(0, self.rows.to(a.device))
        return picked.reshape(len(self.objectives), -1, a.shape[-1])


class RowGroups:
    """The segments of one layer call (``num_rows`` rows, each labelled with its objective), grouped."""

    def __init__(self, segments: Segments, num_rows: int, device: torch.device):
        self.objectives = torch.tensor([t for t, _ in segments], dtype=torch.long)
        selections = [_indices(rows, device) for _, rows in segments]
        lengths = [len(s) for s in selections]
        # which segment each row is in (every row is in one: the labels cover the call)
        self.segment_of_row = torch.empty(num_rows, dtype=torch.long, device=device)
        for i, selection in enumerate(selections):
            self.segment_of_row[selection] = i
        in_order = all(isinstance(rows, slice) for _, rows in segments) and sum(lengths) == num_rows
        self.buckets: list[Bucket] = []
        if in_order and len(set(lengths)) == 1:
            self.buckets.append(Bucket(self.objectives, torch.arange(len(lengths)), None, lengths[0]))
        else:
            for length in sorted(set(lengths)):
                members = [i for i, n in enumerate(lengths) if n == length]
                rows = torch.cat([selections[i] for i in members])
                self.buckets.append(Bucket(self.objectives[members], torch.tensor(members), rows, length))

    def sums(self, a: torch.Tensor) -> torch.Tensor:
        """(segments, features): the sum of ``a`` (rows first, features last) over each segment's rows."""
        per_row = a.reshape(a.shape[0], -1, a.shape[-1]).sum(1)
        out = per_row.new_zeros(len(self.objectives), a.shape[-1])
        return out.index_add_(0, self.segment_of_row.to(a.device), per_row)

    def objective_of_row(self) -> torch.Tensor:
        return self.objectives.to(self.segment_of_row.device)[self.segment_of_row]


def grouped(segments: Segments, num_rows: int, device: torch.device) -> RowGroups:
    """The grouping of ``segments``, formed once per layer call (cached on the segments when they allow it)."""
    cached = getattr(segments, "groups", None)
    if isinstance(cached, RowGroups):
        return cached
    groups = RowGroups(segments, num_rows, device)
    if isinstance(segments, SegmentList):
        segments.groups = groups
    return groups


class SegmentList(list):  # type: ignore[type-arg]
    """The segments the collector hands a layer's rule: a list of (objective, rows), with room for its grouping."""

    groups: Optional[RowGroups] = None


def _indices(rows: Union[slice, torch.Tensor], device: torch.device) -> torch.Tensor:
    if isinstance(rows, slice):
        return torch.arange(rows.start, rows.stop, device=device)
    return rows.to(device)
