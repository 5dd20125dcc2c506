"""The exact LF-MLF step without per-objective gradient buffers: the Gram and the update layer by layer.

A Gram-based step needs G_ts = g_tᵀg_s and then Σ_t w_t g_t. The buffered path
(:class:`~mtft.gradients.PerObjectiveGradients`) stores every g_t, T × P floats -- 16 GB for XLM-R base at T = 48
(float32, non-embedding weights), 58 GB for XLM-R large. Neither quantity needs them all at once:

* A Gram is a sum over coordinates, G = Σ_layers G^(layer). So each layer's per-objective products (T × P_layer)
  are formed from what the backward pass gave it, reduced over the ranks, added into G and freed.
* The update is linear in the output gradient. The layers never mix examples (:mod:`mtft.gradients.per_objective`),
  so the gradient of Σ_t a_t sum_t with respect to a layer's output at row n is a_{t(n)} δ_n, and Σ_t a_t g_t for
  a layer is the ordinary product of its input and its *row-scaled* output gradient -- one matrix product per layer,
  what a plain step's weight gradient costs, with a_t = w_t / count_t.

What this needs from the backward pass is each trainable layer's input x and output gradient δ (for a Linear, the
(tokens × in) and (tokens × out) matrices its own weight gradient is built from), kept in a *tape* until the
update is written: memory of the order of the activations, independent of T. Three passes over the tape replace the
buffers: the Gram (T × P_layer products per layer, each freed at once), the combination (one product per layer),
and, only with ``gradients.descent_check``, the dot products g_tᵀΔθ (the T products again). A layer whose T products
exceed a fixed budget is formed in chunks -- a Linear by windows of its output features, an embedding by windows of
the rows the step touched -- since a Gram and a dot product are sums over coordinates too; so what the passes hold
beyond the tape is at most the budget and the T × T Gram, at any T (:meth:`LayerwiseGradients._chunks`). A second
backward pass of Σ_t w_t L_t (TorchJD's autogram, Quinton & Rey, 2024, Section 6) would propagate the output
gradients through the network again; scaling the recorded ones avoids that pass (bench/lfmlf_step.py measures both).

That second pass is the other way to write the update, for when memory is what counts
(``gradients.update: backward``, :meth:`LayerwiseGradients.form_during_backward`): no tape. The first
backward pass keeps the graph (``retain_graph``) and each layer's products are formed, added into G and freed the
moment its output gradient arrives; after the solve, a second backward pass of Σ_t a_t sum_t brings every layer its
output gradient already scaled, and its product with the layer's input is the update. What the step holds beyond a
plain step's is then one chunk of products and the T × T Gram -- for one more backward pass of time. It is exact
when each layer's products are complete at its hook: one micro-batch per step, one process (the dense products of
several ranks must be summed before their Gram, in the same layer order on every rank) -- where it may run is
:func:`mtft.config.bufferless.second_backward_refusal`'s -- and each trainable layer called once per forward pass (a
second call of a layer is refused here: the first call's products would have entered the Gram alone).

Several micro-batches per step: a layer's products are summed over every micro-batch's records before they enter
the Gram, so the cross terms between micro-batches are exact (the tape then holds every micro-batch's layer inputs
and output gradients: the memory of the step's whole batch). Several ranks: a layer's dense products are
reduce-scattered (rank r keeps 1/N of the columns of every objective), each rank adds its columns' part of the Gram,
and the T × T partials are all-reduced once, as :class:`~mtft.gradients.ShardedGradients` does; row-sparse weights
(embedding tables, Multi-LoRA B's) are all-reduced over the union of the ranks' touched rows. Every rank walks the
same layers in the same order (the registration order: a layer with no rows on this rank contributes zeros), so
the collectives agree. Each rank combines its own rows; the engine's averaging of N × that over the ranks is the
combination of the global batch.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Collection, Iterable, Iterator, Optional, Sequence, cast

import torch
from torch import nn

from mtft.core.distributed import reduce_scatter
from mtft.core.per_objective import Segments, grouped
from mtft.gradients.layers import Rule
from mtft.gradients.per_objective import (
    FirstWriteProducts,
    Metric,
    OnlyRows,
    PerObjectiveGradients,
    gram_of_blocks,
    matvec,
)
from mtft.gradients.row_sparse import RowSparseBuffer
from mtft.gradients.shapes import full_numel, full_shape

# the default chunk budget: this many objectives' products of the largest layer (LayerwiseGradients), and at least
# MIN_CHUNK_BYTES (smaller chunks cost more calls than memory they save)
CHUNK_OBJECTIVES = 32
MIN_CHUNK_BYTES = 1 << 20


@dataclass
class _Record:
    """What one call of a layer left for the step: its rule's saved input, the rows' objectives, the gradient of its
    output and the dimension of the output that holds the rows."""

    rule: Rule
    saved: Any
    segments: Segments
    grad: torch.Tensor
    dim: int


class LayerProducts(FirstWriteProducts):
    """The per-objective products of one layer's parameters (the :class:`~mtft.core.per_objective.Products` a rule
    writes through), for ``num_objectives`` objectives: dense (T, *shape) tensors, row-sparse ones by touched row.
    ``keep``: the parameters to compute (others are skipped by the rules). A chunk of a large layer
    (:class:`Chunk`) keeps a window of elements of a dense parameter, (T, window) then, and a window of rows of a
    row-sparse one."""

    def __init__(
        self,
        keep: Sequence[torch.Tensor],
        sparse: set[torch.Tensor],
        num_objectives: int,
        dtype: torch.dtype,
        workspace: Optional["Workspace"] = None,
        chunk: Optional["Chunk"] = None,
    ):
        self.dtype = dtype
        self.num_objectives = num_objectives
        self.params = list(keep)  # in the layer's own order
        self.keep = set(keep)
        self.dense: dict[torch.Tensor, torch.Tensor] = {}
        self.workspace = workspace
        self.windows = {} if chunk is None else chunk.columns
        inside = {} if chunk is None else chunk.rows
        self.sparse: dict[torch.Tensor, RowSparseBuffer] = {
            p: workspace.rows(p, inside.get(p)) if workspace is not None else RowSparseBuffer(p, num_objectives, dtype)
            for p in keep
            if p in sparse
        }
        self._written: set[tuple[torch.Tensor, int]] = set()

    def trains(self, param: torch.Tensor) -> bool:
        return param in self.keep

    def rows(self, param: torch.Tensor) -> RowSparseBuffer:
        return self.sparse[param]

    def _window(self, param: torch.Tensor) -> Optional[slice]:
        return self.windows.get(param)

    def columns(self, param: torch.Tensor) -> slice:
        """The elements of a dense parameter (flattened) that :meth:`of` holds."""
        return self.windows.get(param, slice(None))

    def _buffer(self, param: torch.Tensor) -> torch.Tensor:
        buffer = self.dense.get(param)
        if buffer is None:  # uninitialised: a first write overwrites, of() zeroes the rows never written
            window = self._window(param)
            shape = (
                (self.num_objectives, *full_shape(param))
                if window is None
                else (self.num_objectives, window.stop - window.start)
            )
            if self.workspace is not None:
                buffer = self.dense[param] = self.workspace.take(shape, self.dense.values(), param.device)
            else:
                buffer = self.dense[param] = torch.empty(shape, dtype=self.dtype, device=param.device)
        return buffer

    def _block(self, param: torch.Tensor, objectives: list[int]) -> tuple[torch.Tensor, list[int], list[bool]]:
        buffer = self._buffer(param)
        first = [(param, t) not in self._written for t in objectives]
        self._written.update((param, t) for t in objectives)
        return buffer.view(self.num_objectives, -1), objectives, first

    def of(self, param: torch.Tensor) -> torch.Tensor:
        """(T, *shape) products of a dense parameter (zeros where nothing was written); (T, window) in a chunk."""
        buffer = self._buffer(param)
        for t in range(self.num_objectives):
            if (param, t) not in self._written:
                buffer[t].zero_()
                self._written.add((param, t))
        return buffer

    @property
    def nbytes(self) -> int:
        """The products held: the dense tensors and the row-sparse stores (their discard slot included)."""
        return sum(b.numel() * b.element_size() for b in self.dense.values()) + sum(
            b.nbytes for b in self.sparse.values()
        )


@dataclass
class Chunk:
    """Part of a layer's products formed in one pass over its records, when the whole would exceed the memory
    budget: the parameters computed, a window of elements of each dense one (``columns``; absent: all of them) and
    the rows of each row-sparse one (``rows``, a boolean mask; absent: every row)."""

    params: list[torch.Tensor]
    columns: dict[torch.Tensor, slice] = field(default_factory=dict)
    rows: dict[torch.Tensor, torch.Tensor] = field(default_factory=dict)


class Workspace:
    """Memory the Gram and dot passes reuse from layer to layer and step to step: one flat scratch tensor for the
    dense products of the layer in hand (as large as the largest layer's T × P_layer), and the row-sparse buffers of
    each weight (kept at the size of their touched rows). Freshly allocated memory is paid for again at every first
    touch of its pages; reused memory is not, and the peak stays one layer's."""

    def __init__(self, num_objectives: int, dtype: torch.dtype, reuse_dense: bool = True):
        """``reuse_dense=False``: dense products are fresh tensors (the combination returns them)."""
        self.num_objectives, self.dtype, self.reuse_dense = num_objectives, dtype, reuse_dense
        self.scratch = torch.empty(0, dtype=dtype)
        self._rows: dict[torch.Tensor, RowSparseBuffer] = {}

    def take(self, shape: tuple[int, ...], held: Iterable[torch.Tensor], device: torch.device) -> torch.Tensor:
        """A (T, ...) tensor of ``shape`` placed after the layer's tensors ``held`` (uninitialised)."""
        if not self.reuse_dense:
            return torch.empty(shape, dtype=self.dtype, device=device)
        start = sum(t.numel() for t in held)
        size = int(torch.Size(shape).numel())
        if self.scratch.numel() < start + size or self.scratch.device != device:
            # grown once to the largest layer; the layer's earlier tensors keep the old storage until it is done
            self.scratch = torch.empty(start + size, dtype=self.dtype, device=device)
        return self.scratch[start : start + size].view(shape)

    def rows(self, param: torch.Tensor, inside: Optional[torch.Tensor] = None) -> RowSparseBuffer:
        """The cleared row-sparse buffer of ``param``; ``inside``: only these rows get slots (a chunk's window)."""
        buffer = self._rows.get(param)
        if buffer is None:  # grown as rows come (a window's buffer to the window's size: restrict)
            buffer = self._rows[param] = RowSparseBuffer(param, self.num_objectives, self.dtype, capacity=1)
        buffer.clear()
        buffer.restrict(inside)
        return buffer


class LayerwiseGradients:
    """Per-objective Gram, combination and dot products formed layer by layer from a tape of the backward pass
    (module docstring): the answers of :class:`~mtft.gradients.PerObjectiveGradients` after the reduction, to
    round-off, without its T × P buffers. Attach to a collector built with ``dense_in_buffer=False``."""

    def __init__(
        self,
        collector: PerObjectiveGradients,
        rank: int = 0,
        world_size: int = 1,
        chunk_bytes: Optional[int] = None,
    ):
        """``chunk_bytes``: the most a layer's products may hold at once; a larger layer is formed in chunks
        (:meth:`_chunks`). None: as much as :data:`CHUNK_OBJECTIVES` objectives' products of the largest layer, and
        at least :data:`MIN_CHUNK_BYTES` -- whatever T, so that the memory the passes hold does not grow with it."""
        if collector.width:
            raise ValueError("LayerwiseGradients needs a PerObjectiveGradients built with dense_in_buffer=False")
        self.collector = collector
        self.num_objectives = collector.num_objectives
        self.rank, self.world_size = rank, world_size
        self.tape: dict[nn.Module, list[_Record]] = {}
        # the step's touched rows of each row-sparse weight that is formed in windows (every rank's), found once a
        # step: the Gram and the dot passes walk the same windows
        self.touched: dict[torch.Tensor, torch.Tensor] = {}
        self.peak_layer_bytes = 0  # the largest layer's products held at once, since construction
        self.workspace = Workspace(self.num_objectives, collector.dtype)
        self.live: Optional[_LiveGram] = None  # gradients.update: backward (form_during_backward)
        self.combine_workspace = Workspace(1, collector.dtype, reuse_dense=False)
        itemsize = torch.empty(0, dtype=collector.dtype).element_size()
        if chunk_bytes is None:
            largest = max((self._dense_numel(m) for m in collector.modules), default=0)
            chunk_bytes = max(CHUNK_OBJECTIVES * largest * itemsize, MIN_CHUNK_BYTES)
        self.chunk_bytes = chunk_bytes
        # elements of every objective's products a chunk holds (at least one row of any weight: see _chunks)
        self.chunk_elements = max(1, chunk_bytes // (self.num_objectives * itemsize))
        collector.recorder = self

    def _dense_numel(self, module: nn.Module) -> int:
        sparse = set(self.collector.sparse)
        own = module.parameters(recurse=False)
        return sum(full_numel(p) for p in own if p in self.collector.names and p not in sparse)

    # -- the backward pass ------------------------------------------------------------------------------
    def zero(self) -> None:
        """Start a new step: forget the tape (its tensors are freed) and the touched rows."""
        self.tape = {}
        self.touched = {}
        self.live = None

    def record(self, rule: Rule, saved: Any, segments: Segments, grad: torch.Tensor, dim: int) -> None:
        record = _Record(rule, saved, segments, grad, dim)
        if self.live is None:
            self.tape.setdefault(rule.module, []).append(record)
        elif self.live.combination is not None:
            self._combine_record(record)
        else:
            self._gram_of_record(record)

    # -- the Gram during the backward pass, the update by a second one (gradients.update: backward) ---------------
    def form_during_backward(
        self, params: list[nn.Parameter], only_rows: OnlyRows = None, metric: Metric = None
    ) -> None:
        """The step's backward pass forms the Gram of ``params`` (as :meth:`gram` would) layer by layer as it goes,
        keeping no tape; :meth:`gram` then returns it. Call :meth:`zero` first, and run the backward pass with
        ``retain_graph=True``: the update comes from a second one, inside :meth:`combining`. One process only (where
        it may run is :func:`mtft.config.bufferless.second_backward_refusal`'s)."""
        assert self.world_size == 1, "the Gram formed during the backward pass runs on one process"
        gram = torch.zeros(self.num_objectives, self.num_objectives, dtype=torch.float64)
        self.live = _LiveGram(set(params), only_rows, metric, gram)

    def _gram_of_record(self, record: _Record) -> None:
        live = cast(_LiveGram, self.live)
        module = record.rule.module
        if module in live.formed:
            raise RuntimeError(
                f"a trainable layer ({type(module).__name__}) ran twice in one step: its products must be summed "
                "before they enter the Gram, which forming the Gram during the backward pass cannot do (each layer "
                "called once); use gradients.update=tape"
            )
        live.formed.add(module)
        params = [p for p in module.parameters(recurse=False) if p in self.collector.names and p in live.shared]
        # a workspace of this layer's own, freed with it: memory is this way's point, and the graph is held whole
        # through the pass, so no scratch is kept from layer to layer or step to step (the reused one of the tape's
        # passes would hold a dense chunk and a row window on top of the graph). On a GPU a freed block goes back to
        # the caching allocator; on CPU fresh pages cost their first touch (a few percent of step time).
        own = Workspace(self.num_objectives, self.collector.dtype, reuse_dense=False)
        for products in self._layer_products(params, [record], own):
            live.gram += sum(self._gram_parts(products, live.only_rows, live.metric))
            del products

    @contextlib.contextmanager
    def combining(self) -> Iterator[None]:
        """Around the second backward pass, of Σ_t a_t sum_t: each layer's output gradient arrives scaled, and its
        product with the layer's input is added into the combination (:meth:`contribution` returns it)."""
        if self.live is None:
            raise RuntimeError("combining() follows a backward pass under form_during_backward()")
        self.live.combination = {}
        yield

    def _combine_record(self, record: _Record) -> None:
        combination = cast(dict, cast(_LiveGram, self.live).combination)
        module = record.rule.module
        products = combination.get(module)
        if products is None:
            products = combination[module] = self._combination_products(module)
        record.rule.products(record.saved, _all_rows(record.grad.shape[record.dim]), record.grad, products)

    # -- the passes over the tape ---------------------------------------------------------------------------
    def _products(self, keep: Collection[torch.Tensor]) -> Iterator[tuple[nn.Module, LayerProducts]]:
        """Every layer's per-objective products of its parameters in ``keep``, summed over the step's records, one
        layer -- or one chunk of a large layer -- at a time (in registration order on every rank; a layer this rank
        did not run yields zeros)."""
        for module in self.collector.modules:
            params = [p for p in module.parameters(recurse=False) if p in self.collector.names and p in keep]
            for products in self._layer_products(params, self.tape.get(module, [])):
                yield module, products

    def _layer_products(
        self, params: Sequence[torch.Tensor], records: list[_Record], workspace: Optional[Workspace] = None
    ) -> Iterator[LayerProducts]:
        """One layer's per-objective products of ``params`` from its ``records``, whole or chunk by chunk (in
        ``workspace``; default: the one reused across layers and steps)."""
        if not params:
            return
        workspace = workspace or self.workspace
        sparse = set(self.collector.sparse)
        for chunk in self._chunks(params, sparse, records, workspace):
            out = self._pass(chunk, sparse, records, workspace)
            self.peak_layer_bytes = max(self.peak_layer_bytes, out.nbytes)
            yield out

    def _pass(
        self, chunk: Chunk, sparse: set[torch.Tensor], records: list[_Record], workspace: Workspace
    ) -> LayerProducts:
        out = LayerProducts(chunk.params, sparse, self.num_objectives, self.collector.dtype, workspace, chunk)
        for record in records:
            record.rule.products(record.saved, record.segments, record.grad, out)
        return out

    def _chunks(
        self,
        params: Sequence[torch.Tensor],
        sparse: set[torch.Tensor],
        records: list[_Record],
        workspace: Workspace,
    ) -> Iterator[Chunk]:
        """A layer in one pass when T × its parameters fit in the chunk budget (the usual case), else in chunks of at
        most ``chunk_elements`` per objective, so that the memory the Gram and dot passes hold does not grow with T:
        a dense parameter by windows of whole rows of its first dimension (a Linear's output features, which a
        rule forms by cutting its products' left factor), a row-sparse one by windows of the rows the step touched
        (found by a pass that keeps none; rows outside a window go to a discard slot, see
        :meth:`~mtft.gradients.row_sparse.RowSparseBuffer.restrict`). The plan depends on shapes and, for
        row-sparse weights, on the union of the ranks' touched rows: every rank walks the same chunks."""
        if sum(full_numel(p) for p in params) <= self.chunk_elements:
            yield Chunk(list(params))
            return
        budget = self.chunk_elements
        pieces: list[tuple[torch.Tensor, slice]] = []
        for p in params:
            if p in sparse:
                continue
            numel, shape = full_numel(p), full_shape(p)
            row = numel // shape[0] if len(shape) and shape[0] else max(numel, 1)
            width = max(1, budget // row) * row  # whole rows; one row when a row alone exceeds the budget
            pieces += [(p, slice(start, min(start + width, numel))) for start in range(0, numel, width)]
        chunk = Chunk([])
        for p, window in pieces:  # consecutive pieces of different parameters share a chunk while they fit
            held = sum(w.stop - w.start for w in chunk.columns.values())
            if chunk.params and (p in chunk.columns or held + window.stop - window.start > budget):
                yield chunk
                chunk = Chunk([])
            chunk.params.append(p)
            chunk.columns[p] = window
        if chunk.params:
            yield chunk
        for p in params:
            if p in sparse:
                yield from self._row_windows(p, sparse, records, workspace)

    def _row_windows(
        self,
        param: torch.Tensor,
        sparse: set[torch.Tensor],
        records: list[_Record],
        workspace: Workspace,
    ) -> Iterator[Chunk]:
        """Chunks of a row-sparse weight: its touched rows (every rank's), a window of them at a time."""
        shape = full_shape(param)
        per_row = full_numel(param) // max(shape[0], 1)
        touched = self.touched.get(param)
        if touched is None:  # a pass that keeps no row finds them
            nothing = torch.zeros(shape[0], dtype=torch.bool)
            counting = self._pass(Chunk([param], rows={param: nothing}), sparse, records, workspace)
            touched = counting.sparse[param].outside_rows()
            if self.world_size > 1:  # the union of the ranks' rows, so that every rank walks the same windows
                union = torch.zeros(shape[0], dtype=torch.float32, device=touched.device)
                union[touched] = 1
                torch.distributed.all_reduce(union)
                touched = union.nonzero(as_tuple=True)[0]
            self.touched[param] = touched
        rows_per_window = max(1, self.chunk_elements // max(per_row, 1))
        for start in range(0, len(touched), rows_per_window):
            inside = torch.zeros(shape[0], dtype=torch.bool, device=touched.device)
            inside[touched[start : start + rows_per_window]] = True
            yield Chunk([param], rows={param: inside})

    def gram(self, params: list[nn.Parameter], only_rows: OnlyRows = None, metric: Metric = None) -> torch.Tensor:
        """G_ts = g_tᵀ g_s (or g_tᵀ P g_s) over ``params``, as :meth:`PerObjectiveGradients.gram`, of the global
        batch's gradients (sums of the ranks'): each layer's dense products reduce-scattered and this rank's columns
        added into a partial Gram, all-reduced at the end; row-sparse weights over the union of touched rows."""
        if self.live is not None:  # formed during the backward pass
            return self.live.gram.clone()
        partial = torch.zeros(self.num_objectives, self.num_objectives, dtype=torch.float64)
        whole = torch.zeros_like(partial)  # the row-sparse weights': the same on every rank
        for _, products in self._products(set(params)):
            dense_part, sparse_part = self._gram_parts(products, only_rows, metric)
            partial += dense_part
            whole += sparse_part
            del products
        if self.world_size > 1:
            torch.distributed.all_reduce(partial)
        return partial + whole

    def _gram_parts(
        self, products: LayerProducts, only_rows: OnlyRows, metric: Metric
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's (or chunk's) part of the Gram: its dense parameters' (this rank's columns of the reduced
        products, all-reduced by the caller) and its row-sparse ones' (already the global batch's)."""
        partial = torch.zeros(self.num_objectives, self.num_objectives, dtype=torch.float64)
        whole = torch.zeros_like(partial)
        dense = [p for p in products.params if p not in products.sparse]
        if dense:
            partial += self._dense_gram(products, dense, metric)
        for p, buffer in products.sparse.items():
            keep = None if only_rows is None else only_rows.get(cast(nn.Parameter, p))
            if keep is None and self.world_size == 1:  # all the touched rows, in slot order (no copy)
                rows, block = buffer.used()
            else:
                rows = self._reduced_rows(buffer)
                if keep is not None:
                    rows = rows[torch.isin(rows, keep.to(rows.device))]
                block = buffer.block(rows)
            whole += gram_of_blocks([(block, None if metric is None else metric[p][rows])], self.num_objectives)
        return partial, whole

    def _dense_gram(self, products: LayerProducts, dense: list[torch.Tensor], metric: Metric) -> torch.Tensor:
        blocks = [products.of(p).reshape(self.num_objectives, -1) for p in dense]
        diagonals = None if metric is None else [metric[p].reshape(-1)[products.columns(p)] for p in dense]
        if self.world_size == 1:
            pairs = [(b, None if diagonals is None else diagonals[i]) for i, b in enumerate(blocks)]
            return gram_of_blocks(pairs, self.num_objectives)
        row = torch.cat(blocks, dim=1)
        size = row.shape[1]
        part = -(-size // self.world_size)
        padded = torch.zeros(self.num_objectives, self.world_size * part, dtype=row.dtype, device=row.device)
        padded[:, :size] = row
        del row, blocks
        send = padded.view(self.num_objectives, self.world_size, part).transpose(0, 1).contiguous()
        del padded
        received = torch.empty(self.num_objectives, part, dtype=send.dtype, device=send.device)
        reduce_scatter(received.view(-1), send.view(-1))
        del send
        diagonal = None
        if diagonals is not None:
            full = torch.zeros(self.world_size * part, dtype=diagonals[0].dtype, device=received.device)
            full[:size] = torch.cat([d.to(received.device) for d in diagonals])
            diagonal = full[self.rank * part : (self.rank + 1) * part]
        return gram_of_blocks([(received, diagonal)], self.num_objectives)

    def _reduced_rows(self, buffer: RowSparseBuffer) -> torch.Tensor:
        """The touched rows of a row-sparse buffer, its blocks summed over the ranks (over the union of their rows)."""
        if self.world_size > 1:
            if buffer.inside is None:  # a window's slots are the ranks' union's rows already (_row_windows)
                buffer.take_union_of_ranks()
            return buffer.all_reduce_touched()
        return buffer.touched()

    def contribution(self, weights: torch.Tensor) -> dict[torch.Tensor, torch.Tensor]:
        """What this rank hands the engine for Σ_t weights_t g_t (``weights`` may fold in 1/count_t): every layer's
        product of its input with the row-scaled output gradient, over this rank's rows, × N -- the engine averages
        over the ranks, so the average is the global combination. Every trainable parameter gets a tensor (zeros
        where no row of this rank reached it)."""
        out: dict[torch.Tensor, torch.Tensor] = {}
        if self.live is not None:  # written by the second backward pass, of the weighted losses
            if self.live.combination is None:
                raise RuntimeError(
                    "under form_during_backward() the combination comes from a backward pass in combining()"
                )
            for module in self.collector.modules:
                products = self.live.combination.get(module)
                if products is None:  # no row reached it
                    products = self._combination_products(module)
                out.update(_combined_values(products, self.world_size))
            self.live.combination = None
            return out
        weights = weights.to(self.collector.dtype)
        for module in self.collector.modules:
            products = self._combination_products(module)
            for record in self.tape.get(module, []):
                grad = _scaled(record, weights)
                record.rule.products(record.saved, _all_rows(grad.shape[record.dim]), grad, products)
            out.update(_combined_values(products, self.world_size))
        return out

    def _combination_products(self, module: nn.Module) -> LayerProducts:
        params = [p for p in module.parameters(recurse=False) if p in self.collector.names]
        return LayerProducts(params, set(self.collector.sparse), 1, self.collector.dtype, self.combine_workspace)

    def combine(self, weights: torch.Tensor) -> dict[torch.Tensor, torch.Tensor]:
        """Σ_t weights_t g_t of the global batch on every rank (the engine's averaging of :meth:`contribution`, done
        here: for tests and tools, not the step)."""
        out = self.contribution(weights)
        if self.world_size > 1:
            for value in out.values():
                torch.distributed.all_reduce(value)
                value.div_(self.world_size)
        return out

    def dot(self, vectors: dict[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """(g_tᵀ v)_t in float64 for a vector given per parameter, as :meth:`PerObjectiveGradients.dot`: the
        products formed again layer by layer, this rank's rows, summed over the ranks (the dot is linear)."""
        if self.live is not None:
            raise RuntimeError("dot products need the tape, which form_during_backward() does not keep")
        out = torch.zeros(self.num_objectives, dtype=torch.float64)
        for _, products in self._products(set(vectors)):
            for p in products.params:
                v = vectors[p].to(products.dtype)
                if p in products.sparse:  # this rank's rows, summed over the ranks after: slot order
                    rows, block = products.sparse[p].used()
                    v = v.to(block.device)[rows]
                else:
                    block = products.of(p)
                    v = v.reshape(-1)[products.columns(p)]
                out += matvec(block.reshape(self.num_objectives, -1), v.reshape(-1).to(block.device))
        if self.world_size > 1:
            torch.distributed.all_reduce(out)
        return out


def _all_rows(rows: int) -> list[tuple[int, slice]]:
    """A layer call's rows as one segment, for a product that weighs no objective apart (the combination Σ_t a_t g_t,
    whose rows come scaled): none for a call without rows (a head none of the step's rows reached), which the rules
    skip as they skip it in the per-objective products."""
    return [(0, slice(0, rows))] if rows else []


def _scaled(record: _Record, weights: torch.Tensor) -> torch.Tensor:
    """The record's output gradient with row n scaled by weights[t(n)]: the output gradient of Σ_t w_t sum_t."""
    rows = record.grad.shape[record.dim]
    groups = grouped(record.segments, rows, record.grad.device)
    scale = weights.to(record.grad.device)[groups.objective_of_row()]
    shape = [1] * record.grad.dim()
    shape[record.dim] = rows
    return record.grad * scale.view(shape).to(record.grad.dtype)


@dataclass
class _LiveGram:
    """The Gram being formed during the backward pass (:meth:`LayerwiseGradients.form_during_backward`): its
    parameters and options, the sum so far, the layers already in it; then the combination the second backward pass
    writes, per layer."""

    shared: set[torch.Tensor]
    only_rows: OnlyRows
    metric: Metric
    gram: torch.Tensor
    formed: set[nn.Module] = field(default_factory=set)
    combination: Optional[dict[nn.Module, LayerProducts]] = None


def _combined_values(products: LayerProducts, world_size: int) -> dict[torch.Tensor, torch.Tensor]:
    """A layer's combination per parameter (zeros where nothing was written), × N on several ranks (the engine
    averages over them)."""
    out = {}
    for p in products.params:
        value = products.sparse[p].full()[0] if p in products.sparse else products.of(p)[0]
        out[p] = value * world_size if world_size > 1 else value
    return out
