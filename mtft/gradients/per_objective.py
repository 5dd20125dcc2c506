"""Exact per-objective gradients at about the cost of one backward pass.

Every example belongs to exactly one objective, and an encoder never mixes examples (attention, layer norm
and feed-forward layers all act within one sequence). So the gradient of the summed loss with respect to a
layer's *output* for example n is the gradient of n's own objective alone, and the gradient of objective t
with respect to a weight is the sum, over t's examples, of the usual per-example products (for a Linear layer
∂L_t/∂W = Σ_{n∈t} δ_nᵀ x_n). Which products a layer has is its own business (:mod:`mtft.gradients.layers`: the
rules of torch's Linear, Embedding and LayerNorm there; any other layer provides its own, e.g. Multi-LoRA's routed
B's, ∂L_t/∂B[j] = Σ_{n∈t, slot(n)=j} δ_nᵀ (A·x_n), or the MHLoss heads').

Forward hooks keep each layer's input; a hook on its output receives δ during the backward pass of
Σ_t sum_t; the products are summed per objective into a (T, *shape) buffer per parameter (written in place,
and cleared lazily: the buffers are T times the trainable parameters, so every pass over them counts). With the batch
sorted by objective the rows of each objective are one contiguous slice, so a layer costs one matrix product
per present objective -- together the same arithmetic as the ordinary weight gradient, which is skipped (the
forward runs on detached parameters). Libraries for per-sample gradients (Opacus, torch.func) materialise one
gradient per *example*; summing per objective inside the hook is what makes this affordable, hence by hand.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional, Protocol, cast

import torch
from torch import nn

from mtft.core.per_objective import SegmentList, Segments
from mtft.core.rows import declared_rows, row_labels
from mtft.gradients.layers import Rule
from mtft.gradients.row_sparse import RowSparseBuffer
from mtft.gradients.shapes import full_numel, full_shape

# A Gram's optional restrictions: the rows of row-sparse weights it reads, a diagonal metric per parameter
OnlyRows = Optional[dict[nn.Parameter, torch.Tensor]]
Metric = Optional[dict[torch.Tensor, torch.Tensor]]

# Columns of the buffers scaled at a time when a Gram is formed in a metric (bounds the scaled copy to T × this).
METRIC_CHUNK = 1 << 20


class GradientSink(Protocol):
    """Where the dense parameters' per-objective gradients go instead of the flat buffer (the sharded path,
    :mod:`mtft.gradients.sharded`, which reduces each layer's as soon as the backward pass has written it)."""

    def block(self, param: torch.Tensor, objectives: list[int]) -> tuple[torch.Tensor, list[int]]:
        """A (rows, numel) view holding ``param``'s gradients, and the row of each of ``objectives``."""
        ...

    def forwarded(self, module: nn.Module, output: torch.Tensor) -> None: ...

    def accumulated(self, module: nn.Module) -> None: ...


# stands for a recomputed layer's input until activation checkpointing's recomputation hands it over
_RECOMPUTED = object()


class Recorder(Protocol):
    """Where a layer's backward-pass call goes instead of its per-objective products (the bufferless step's tape,
    :class:`mtft.gradients.layerwise.LayerwiseGradients`)."""

    def record(self, rule: Rule, saved: Any, segments: Segments, grad: torch.Tensor, dim: int) -> None: ...


class FirstWriteProducts:
    """Writing a layer's per-objective products (:class:`~mtft.core.per_objective.Products`) into targets of which the
    first write of a step overwrites and later ones add (cheaper than clearing them first): subclasses say where
    objective t's gradient of a parameter lives and whether this is its first write (``_block``), and may keep a
    window of a parameter's flattened elements only (``_window``: the bufferless step's chunks)."""

    dtype: torch.dtype

    def _block(self, param: torch.Tensor, objectives: list[int]) -> tuple[torch.Tensor, list[int], list[bool]]:
        """A (rows, kept elements) view of ``param``'s targets, each objective's row in it, and whether each
        objective's write is its first (recorded as written)."""
        raise NotImplementedError

    def _window(self, param: torch.Tensor) -> Optional[slice]:
        """The elements of ``param`` (flattened) that the targets keep; None: all of them."""
        return None

    def write(self, param: torch.Tensor, t: int, value: torch.Tensor) -> None:
        block, (row,), (first,) = self._block(param, [t])
        target, window = block[row], self._window(param)
        value = (value.reshape(-1) if window is None else value.reshape(-1)[window]).to(target.dtype)
        target.copy_(value) if first else target.add_(value)

    def write_product(self, param: torch.Tensor, t: int, a: torch.Tensor, b: torch.Tensor) -> None:
        window = self._window(param)
        kept = _kept_rows(b.shape[-1], window)
        if a.dtype != self.dtype or kept is None:  # e.g. bf16 activations, float32 buffers
            return self.write(param, t, a @ b)
        a = a[kept]
        block, (row,), (first,) = self._block(param, [t])
        target = block[row].view(a.shape[0], b.shape[-1])
        if first:
            torch.mm(a, b, out=target)
        else:
            target.addmm_(a, b)

    def write_all(self, param: torch.Tensor, objectives: torch.Tensor, values: torch.Tensor) -> None:
        ts = objectives.tolist()
        block, rows, first = self._block(param, ts)
        values, window = values.reshape(len(ts), -1), self._window(param)
        _write_rows(block, rows, first, (values if window is None else values[:, window]).to(block.dtype))

    def write_products(self, param: torch.Tensor, objectives: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
        ts = objectives.tolist()
        window = self._window(param)
        kept = _kept_rows(b.shape[-1], window)
        if kept is None:  # the window cuts a row of the products: formed whole, then cut
            return self.write_all(param, objectives, torch.bmm(a, b))
        a = a[:, kept]
        block, rows, first = self._block(param, ts)
        run = slice(rows[0], rows[0] + len(rows)) if rows else slice(0, 0)
        if a.dtype == block.dtype and rows == list(range(run.start, run.stop)) and (all(first) or not any(first)):
            # the rows are one run of the block: the products go straight into it (no (k, P_layer) temporary,
            # whose fresh pages would cost as much again)
            target = block[run].view(len(rows), a.shape[1], b.shape[2])
            if all(first):
                torch.bmm(a, b, out=target)
            else:
                target.baddbmm_(a, b)
            return
        _write_rows(block, rows, first, torch.bmm(a, b).reshape(len(rows), -1).to(block.dtype))


def _kept_rows(columns: int, window: Optional[slice]) -> Optional[slice]:
    """The rows of a product a @ b with ``columns`` columns whose elements, flattened, are ``window`` (all of them
    without a window): the rows of ``a`` to multiply; None when the window starts or ends inside a row."""
    if window is None:
        return slice(None)
    if window.start % columns or window.stop % columns:
        return None
    return slice(window.start // columns, window.stop // columns)


def _write_rows(block: torch.Tensor, rows: list[int], first: list[bool], values: torch.Tensor) -> None:
    """``block[rows[i]]`` gets ``values[i]``: overwritten where ``first[i]``, else added."""
    index = torch.tensor(rows, dtype=torch.long, device=block.device)
    if all(first):
        block.index_copy_(0, index, values)
    elif not any(first):
        block.index_add_(0, index, values)
    else:
        fresh = torch.tensor(first, device=block.device)
        block.index_copy_(0, index[fresh], values[fresh])
        block.index_add_(0, index[~fresh], values[~fresh])


class PerObjectiveGradients(FirstWriteProducts):
    """Accumulates ∂(Σ_{n∈t} loss_n)/∂θ for every objective t and trainable parameter θ of ``model``.

    The dense parameters' buffers live in one flat (T, P) tensor, so that data-parallel ranks reduce them in one
    call; row-sparse weights keep their touched rows only (:class:`~mtft.gradients.row_sparse.RowSparseBuffer`).
    ``dense_in_buffer=False``: no flat buffer; the dense parameters' gradients are written where ``sink`` says
    (set before the first backward pass; see :mod:`mtft.gradients.sharded`, which reduces each layer's as soon as
    the backward pass has written it).
    """

    def __init__(
        self,
        model: nn.Module,
        num_objectives: int,
        dtype: Optional[torch.dtype] = None,
        dense_in_buffer: bool = True,
    ):
        self.num_objectives = num_objectives
        self.names: dict[nn.Parameter, str] = {}
        self.modules: list[nn.Module] = []
        self.rules: dict[nn.Module, Rule] = {}
        unsupported = []
        for module_name, module in model.named_modules():
            own = [(n, p) for n, p in module.named_parameters(recurse=False) if p.requires_grad]
            if not own:
                continue
            rule = Rule(module)
            if not rule.supported:
                unsupported.append(f"{module_name} ({type(module).__name__})")
                continue
            self.modules.append(module)
            self.rules[module] = rule
            for n, p in own:
                self.names[p] = f"{module_name}.{n}" if module_name else n
        if unsupported:
            raise ValueError(
                "per-objective gradients cover Linear, Embedding and LayerNorm parameters and layers that compute "
                "their own (mtft.core.per_objective.PerObjectiveLayer); these modules hold other trainable "
                f"parameters: {', '.join(unsupported)}"
            )
        # Parameters whose gradient touches only some rows of the first dimension (an embedding's looked-up tokens,
        # the B's of the Multi-LoRA slots in the batch): their buffers are cleared, reduced to a Gram and combined
        # over the touched rows only -- for Multi-LoRA this makes G block-diagonal across tasks, as the B's of
        # different tasks are disjoint parameters.
        row_sparse = {p for rule in self.rules.values() for p in rule.row_sparse()}
        self.embeddings = [p for p in self.names if p in row_sparse]
        first = next(iter(self.names), None)
        self.dtype = dtype or (torch.float64 if first is not None and first.dtype == torch.float64 else torch.float32)
        dtype = self.dtype
        self.sink: Optional[GradientSink] = None
        # the bufferless step (mtft.gradients.layerwise): the backward pass's layer inputs and output gradients go
        # to its tape instead of into per-objective products
        self.recorder: Optional[Recorder] = None
        self.sparse: dict[torch.Tensor, RowSparseBuffer] = {
            p: RowSparseBuffer(p, num_objectives, dtype) for p in self.embeddings
        }
        params = [p for p in self.names if p not in self.sparse] if dense_in_buffer else []
        sizes = [full_numel(p) for p in params]
        self.width = sum(sizes)  # P (dense)
        device = first.device if first is not None else None
        self.flat = torch.zeros(num_objectives, self.width, dtype=dtype, device=device)
        # keyed by tensor: torch types a module's ``weight`` as a Tensor (each key is a Parameter)
        self.views: dict[torch.Tensor, torch.Tensor] = {}
        self.index: dict[torch.Tensor, int] = {p: i for i, p in enumerate(params)}
        offset = 0
        for p, size in zip(params, sizes):
            self.views[p] = self.flat[:, offset : offset + size].view(num_objectives, *full_shape(p))
            offset += size
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._active = False
        # Activation checkpointing: the layers whose forward runs again in the backward pass (set by the step). Their
        # inputs are taken from that recomputation, not kept from the first forward pass -- which would hold the
        # activations checkpointing frees. A layer's output gradient can arrive before its recomputation (the hook
        # on a layer's output runs before the node that unpacks the layer's saved tensors), so each layer pairs
        # inputs and gradients in two queues, and whichever comes second computes the products.
        self.recomputed: set[nn.Module] = set()
        self._replaying = False
        self._inputs: dict[nn.Module, list[Any]] = {}
        self._waiting: dict[nn.Module, list[tuple[Segments, torch.Tensor, int]]] = {}
        # (parameter, objective) pairs written since zero(): the first write overwrites, later ones add, and
        # finalize() zeroes the rest -- cheaper than clearing all T × P floats every step.
        self._touched: set[tuple[int, int]] = set()
        self._last_segments: tuple[Optional[torch.Tensor], Segments] = (None, [])

    # ------------------------------------------------------------------------------------------------
    def attach(self) -> "PerObjectiveGradients":
        self._handles = [m.register_forward_hook(self._forward_hook) for m in self.modules]
        self._handles += [
            m.register_forward_pre_hook(self._one_lookup_per_row)
            for m in self.modules
            if isinstance(m, nn.Embedding) and self.rules[m].layer is None
        ]
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

    @contextlib.contextmanager
    def replaying(self) -> Iterator[None]:
        """Around the backward pass of a captured forward pass: the recomputed layers' forward calls (activation
        checkpointing) hand over their inputs."""
        self._replaying = True
        try:
            yield
        finally:
            self._replaying = False
            left = [type(m).__name__ for m, queue in {**self._inputs, **self._waiting}.items() if queue]
            self._inputs, self._waiting = {}, {}
        if left:  # after a backward pass that completed (an error inside it propagates as it is)
            raise RuntimeError(f"a recomputed layer's input and output gradient did not pair up: {left}")

    def zero(self) -> None:
        """Start a new optimizer step. Dense buffers are cleared lazily (see :meth:`finalize`); row-sparse
        ones forget their rows."""
        self._touched.clear()
        for buffer in self.sparse.values():
            buffer.clear()

    def finalize(self) -> None:
        """Zero every dense (parameter, objective) slice that no example of the step wrote; on several
        ranks, give every rank's row-sparse buffers the union of the ranks' touched rows (zero where this rank
        touched none), as the reduced buffers will have."""
        for p, view in self.views.items():
            for t in range(self.num_objectives):
                if (self.index[p], t) not in self._touched:
                    view[t].zero_()
                    self._touched.add((self.index[p], t))
        if _several_ranks():
            for buffer in self.sparse.values():
                buffer.take_union_of_ranks()

    def reduce_row_sparse(self) -> None:
        """Sum the row-sparse buffers over ranks, over the touched rows (after :meth:`finalize`)."""
        for buffer in self.sparse.values():
            buffer.all_reduce_touched()

    def touched_rows(self, param: torch.Tensor) -> torch.Tensor:
        return self.sparse[param].touched()

    def gradient(self, param: torch.Tensor) -> torch.Tensor:
        """(T, *param.shape): every objective's gradient of ``param`` (a view of a dense buffer; a row-sparse
        weight's materialised, zero outside its touched rows)."""
        return self.sparse[param].full() if param in self.sparse else self.views[param]

    # ------------------------------------------------------------------------------------------------
    def _one_lookup_per_row(self, module: nn.Module, inputs: tuple[Any, ...]) -> Optional[tuple[Any, ...]]:
        """An embedding looked up once for the whole batch -- BERT's absolute positions, ``position_ids`` of shape
        (1, length), broadcast over the rows -- gets the summed gradient of every row, which no objective can be
        told apart in: while the gradients are captured, its ids are expanded to one lookup per row (the same
        values, so the same forward pass), and each row's gradient reaches the row's objective."""
        if not (self._active or self._replaying):
            return None
        ids, *rest = inputs
        rows = declared_rows("objective")
        if not isinstance(ids, torch.Tensor) or ids.dim() < 1 or ids.shape[0] != 1 or rows is None or rows == 1:
            return None
        return (ids.expand(rows, *ids.shape[1:]), *rest)

    def _forward_hook(self, module: nn.Module, inputs: tuple[Any, ...], output: torch.Tensor) -> Optional[torch.Tensor]:
        if self._replaying and module in self.recomputed:  # activation checkpointing recomputes the layer
            self._inputs.setdefault(module, []).append(self.rules[module].saved(inputs, output)[0])
            self._pair(module)
            return None
        if not self._active:
            return None
        rule = self.rules[module]
        saved, dim = rule.saved(inputs, output)
        if module in self.recomputed:
            saved = _RECOMPUTED  # taken from the recomputation, when the backward pass reaches the layer
        rows = row_labels("objective", type(module).__name__, output.shape[dim])
        if not output.requires_grad:
            # Nothing upstream needs a gradient (frozen embeddings, detached parameters): make the output
            # a leaf so that the backward pass still brings this layer its output gradient -- and drop the copy
            # autograd accumulates into a leaf's .grad (the size of the layer's output; the hook has its own).
            output = output.detach().requires_grad_(True)
            output.register_post_accumulate_grad_hook(_drop_grad)
        segments = self._segments_of(rows)
        output.register_hook(lambda grad: self._accumulate(rule, saved, segments, grad, dim))
        if self.sink is not None:
            self.sink.forwarded(module, output)
        return output

    def _segments_of(self, rows: torch.Tensor) -> Segments:
        """The segments of a call's row labels: the labels a forward pass declares are one tensor for every layer,
        so their segments (and grouping, mtft.gradients.row_groups) are formed once a forward pass, not per layer."""
        cached_rows, cached = self._last_segments
        if cached_rows is not rows:
            cached = _segments(rows)
            self._last_segments = (rows, cached)
        return cached

    @torch.no_grad()
    def _accumulate(self, rule: Rule, saved: Any, segments: Segments, grad: torch.Tensor, dim: int) -> None:
        """``saved``: what the layer's rule kept of its forward call (for most layers its input); ``dim``: the
        dimension of ``grad`` that holds the batch's rows."""
        if saved is _RECOMPUTED:
            self._waiting.setdefault(rule.module, []).append((segments, grad, dim))
            return self._pair(rule.module)
        if self.recorder is not None:
            return self.recorder.record(rule, saved, segments, grad, dim)
        rule.products(saved, segments, grad, self)
        if self.sink is not None:
            self.sink.accumulated(rule.module)

    def _pair(self, module: nn.Module) -> None:
        """A recomputed layer's products, once both its recomputed input and its output gradient are here."""
        inputs, waiting = self._inputs.get(module), self._waiting.get(module)
        if inputs and waiting:
            segments, grad, dim = waiting.pop(0)
            self._accumulate(self.rules[module], inputs.pop(0), segments, grad, dim)

    # -- what a layer's rule writes through (mtft.gradients.layers.Products) ---------------------------------------
    def trains(self, param: torch.Tensor) -> bool:
        return param in self.names

    def rows(self, param: torch.Tensor) -> RowSparseBuffer:
        return self.sparse[param]

    def _block(self, param: torch.Tensor, objectives: list[int]) -> tuple[torch.Tensor, list[int], list[bool]]:
        if param not in self.views:  # the sink's staging rows (zeroed there: add)
            block, rows = cast(GradientSink, self.sink).block(param, objectives)
            return block, rows, [False] * len(rows)
        i = self.index[param]
        first = [(i, t) not in self._touched for t in objectives]
        self._touched.update((i, t) for t in objectives)
        return self.views[param].reshape(self.num_objectives, -1), objectives, first

    # ------------------------------------------------------------------------------------------------
    def gram(self, params: list[nn.Parameter], only_rows: OnlyRows = None, metric: Metric = None) -> torch.Tensor:
        """G_ts = g_tᵀ g_s over ``params``, in float64: row-sparse weights over their touched rows only (and
        within ``only_rows[p]`` where given: e.g. the Multi-LoRA B's that several objectives share), the dense
        rest in one matrix product when every dense parameter is included.

        ``metric``: a positive diagonal preconditioner P (one tensor of each parameter's shape, for every
        parameter in ``params``); the Gram is then G_ts = g_tᵀ P g_s = (√p ⊙ g_t)ᵀ(√p ⊙ g_s), formed by scaling
        column chunks of the buffers (never a full T × P copy)."""
        params = set(params)
        dense = list(self.views)
        blocks: list[tuple[torch.Tensor, Optional[torch.Tensor]]] = []
        for p in self.embeddings:
            if p in params:
                rows, block = self.gram_block(p, only_rows)
                blocks.append((block, None if metric is None else metric[p][rows]))
        if dense and params.issuperset(dense):
            sqrt_p = None if metric is None else torch.cat([metric[p].reshape(-1) for p in dense])
            blocks.append((self.flat, sqrt_p))
        else:
            blocks += [(self.views[p], None if metric is None else metric[p]) for p in dense if p in params]
        return gram_of_blocks(blocks, self.num_objectives)

    def gram_block(self, param: torch.Tensor, only_rows: OnlyRows) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows of a row-sparse weight that a Gram reads (touched this step, and within ``only_rows``) and
        their (T, rows, ...) block: on one process all the touched rows in slot order, without a copy."""
        keep = None if only_rows is None else only_rows.get(cast(nn.Parameter, param))
        if keep is None and not _several_ranks():
            return self.sparse[param].used()
        rows = self.touched_rows(param)
        if keep is not None:
            rows = rows[torch.isin(rows, keep.to(rows.device))]
        return rows, self.sparse[param].block(rows)

    def combine(self, weights: torch.Tensor) -> dict[torch.Tensor, torch.Tensor]:
        """Σ_t w_t g_t for every parameter (weights may fold in a per-objective scale such as 1/count_t); in
        float32 from bfloat16 buffers."""
        dense = weighted_sum(weights, self.flat)
        out, offset = {}, 0
        for p in self.views:
            out[p] = dense[offset : offset + full_numel(p)].view(full_shape(p))
            offset += full_numel(p)
        for p, buffer in self.sparse.items():
            rows, block = buffer.used()  # each row's combination is its own: the slots' order does not matter
            out[p] = torch.zeros(buffer.shape, dtype=dense.dtype, device=self.flat.device)
            out[p][rows] = weighted_sum(weights, block.reshape(self.num_objectives, -1)).view(
                len(rows), *buffer.shape[1:]
            )
        return out

    def contribution(self, weights: torch.Tensor) -> dict[torch.Tensor, torch.Tensor]:
        """What this rank hands the engine, whose gradient averaging over the ranks must give Σ_t w_t g_t: the
        combination itself, the same on every rank (these buffers are whole, all-reduced), so its average is it to
        the round-off of summing N copies. The sharded gradients hand each rank's part instead
        (:meth:`mtft.gradients.ShardedGradients.contribution`)."""
        return self.combine(weights)

    def dot(self, vectors: dict[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """(g_tᵀ v)_t in float64 for a vector v given per parameter (e.g. the update the optimizer applied); a
        parameter missing from ``vectors`` counts as v = 0 there. Row-sparse weights are read over the rows
        this step touched only: their buffers are zero elsewhere."""
        out = torch.zeros(self.num_objectives, dtype=torch.float64)
        for p in vectors:
            if p in self.views:
                view, v = self.views[p], vectors[p].to(self.flat.device)
            elif p in self.sparse:
                rows, view = self.gram_block(p, None)
                v = vectors[p].to(self.flat.device)[rows]
            else:
                continue
            out += matvec(view.reshape(self.num_objectives, -1), v.reshape(-1))
        return out


def _drop_grad(leaf: torch.Tensor) -> None:
    leaf.grad = None


def _several_ranks() -> bool:
    return torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """Sums over buffer columns run in float32 at least: bfloat16 buffers halve the memory, not the Gram's
    precision beyond their own rounding."""
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def _chunks(block: torch.Tensor) -> Iterator[tuple[slice, torch.Tensor]]:
    """Column chunks of ``block`` in its accumulation dtype (a float32 copy of one chunk at a time)."""
    dtype = accumulation_dtype(block.dtype)
    for start in range(0, block.shape[1], METRIC_CHUNK):
        columns = slice(start, start + METRIC_CHUNK)
        yield columns, block[:, columns].to(dtype)


def gram_of_blocks(blocks: list[tuple[torch.Tensor, Optional[torch.Tensor]]], num_objectives: int) -> torch.Tensor:
    """Σ over blocks of B Bᵀ (or (√p ⊙ B)(√p ⊙ B)ᵀ for a block given with its diagonal metric p): each product
    in the buffers' dtype (float32 from bfloat16), the sum in float64. The one place a Gram is accumulated,
    sharded or not."""
    gram = torch.zeros(num_objectives, num_objectives, dtype=torch.float64)
    for block, diagonal in blocks:
        block = block.reshape(num_objectives, -1)
        dtype = accumulation_dtype(block.dtype)
        if diagonal is None and dtype == block.dtype:
            gram += (block @ block.t()).double().cpu()
            continue
        root = None if diagonal is None else diagonal.reshape(-1).to(dtype).to(block.device).sqrt()
        for columns, chunk in _chunks(block):
            scaled = chunk if root is None else chunk * root[columns]
            gram += (scaled @ scaled.t()).double().cpu()
    return gram


def weighted_sum(weights: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
    """Σ_t w_t block[t], a vector in the buffers' accumulation dtype."""
    dtype = accumulation_dtype(block.dtype)
    w = weights.to(dtype).to(block.device)
    if dtype == block.dtype:
        return w @ block
    out = torch.empty(block.shape[1], dtype=dtype, device=block.device)
    for columns, chunk in _chunks(block):
        out[columns] = w @ chunk
    return out


def matvec(block: torch.Tensor, vector: torch.Tensor) -> torch.Tensor:
    """block @ vector in float64, each chunk's product in the buffers' accumulation dtype."""
    dtype = accumulation_dtype(block.dtype)
    vector = vector.to(dtype).to(block.device)
    if dtype == block.dtype:
        return (block @ vector).double().cpu()
    out = torch.zeros(block.shape[0], dtype=torch.float64)
    for columns, chunk in _chunks(block):
        out += (chunk @ vector[columns]).double().cpu()
    return out


def _segments(rows: torch.Tensor) -> SegmentList:
    """(objective, row selector) pairs: contiguous slices when rows are sorted by objective."""
    rows = rows.detach()
    if rows.numel() == 0:
        return SegmentList()
    values, counts = torch.unique_consecutive(rows, return_counts=True)
    if len(set(values.tolist())) == len(values):  # each objective's rows are contiguous
        out, start = SegmentList(), 0
        for t, c in zip(values.tolist(), counts.tolist()):
            out.append((t, slice(start, start + c)))
            start += c
        return out
    return SegmentList((t, (rows == t).nonzero(as_tuple=True)[0]) for t in torch.unique(rows).tolist())
