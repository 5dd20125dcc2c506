"""The per-objective gradients of the global batch, sharded over data-parallel ranks, layer by layer.

The Gram of the rank-averaged gradients is G_ts = ⟨Σ_r g_t^r, Σ_r g_s^r⟩ (up to the 1/count scales the step folds
in) -- not the sum of the ranks' local Grams, so it needs the reduced gradients. It does not need all of them on
every rank: a Gram is a sum over coordinates, G = Σ_shards G^(shard). So

1. during the backward pass, as soon as a layer's per-objective gradients are written (its hook has run), they are
   *reduce-scattered*: one reduce-scatter per layer carrying the rows of every objective present in the
   micro-batch. Rank r keeps part r of every layer (1/N of its columns) of every ḡ_t, T × P/N floats in all, and
   the layer's T × P_layer staging buffer is released -- the T × P buffers of the unsharded path never exist;
2. rank r forms its partial Gram on its shard (the same blocks -- the shared parameters, the optimizer's metric --
   restricted to its columns, each product in the buffers' dtype, summed in float64 as the unsharded Gram is) and
   the T × T partials are all-reduced: T² floats;
3. every rank solves the same Gram for the same weights w;
4. rank r combines Σ_t w_t ḡ_t on its shard. The optimizer step needs it on the parameters, and the engine
   averages every gradient over the ranks anyway (DeepSpeed's all-reduce under ZeRO-0/1, its reduce-scatter into
   the optimizer's partitions under ZeRO-2, into the parameters' partitions under ZeRO-3): so rank r hands the
   engine N × its part, zeros elsewhere (:meth:`contribution`), and that average *is* Σ_t w_t ḡ_t, on every rank or
   in every partition, without the all-gather of P floats that :meth:`combine` (the whole gradient on every rank)
   costs. Each coordinate is non-zero on one rank only, so the sum adds zeros and is exact; the 1/N scaling undoes
   the N exactly when N is a power of two (a power-of-two factor only moves the exponent) and to within an ulp or
   two otherwise (N·x and the division by N each round).

Row-sparse weights (embedding tables, the Multi-LoRA B's) stay out of the shards: their buffers hold the rows the
step touched only (:mod:`mtft.gradients.row_sparse`), are all-reduced over the union of the ranks' touched rows
after the backward pass (:meth:`PerObjectiveGradients.reduce_row_sparse`) and read whole on every rank (their part
of the Gram is then the same on every rank and added after the all-reduce).

The collectives run inside the backward pass, so every rank must issue them in one order although the autograd
engine runs each rank's graph by itself: before each micro-batch's backward pass the ranks agree (one all-reduce of
T + layers counts) on the objectives present and on the layers whose gradient hook will fire anywhere (a layer
whose output reaches the loss, found by walking the autograd graph); the layers are then reduced in reverse
registration order -- the order in which a backward pass reaches them -- each as soon as it and every layer before
it in that order are complete on this rank (a layer out of order waits in its staging buffer). A layer that does
not run on this rank (a head without rows here) sends zeros. Per step: one reduce-scatter of present-T × P_layer
per layer and micro-batch (what ZeRO-2 does with its gradient buckets), a T × T all-reduce, and the engine's own
gradient reduction, which a plain step pays too.
Memory: the T × P/N shard, the staging of the layers in flight, the row-sparse buffers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import nn

from mtft.core.distributed import all_gather, reduce_scatter
from mtft.gradients.per_objective import Metric, OnlyRows, PerObjectiveGradients, gram_of_blocks, matvec, weighted_sum
from mtft.gradients.shapes import full_numel, full_shape

Block = tuple[torch.Tensor, Optional[torch.Tensor]]


@dataclass(frozen=True)
class _Layer:
    """A module's dense parameters: their columns in the module's flat row (``offsets``), padded to N × ``part``;
    this rank's part of it is shard columns [base, base + part)."""

    module: nn.Module
    params: tuple[torch.Tensor, ...]
    offsets: tuple[int, ...]
    size: int
    part: int
    base: int


class ShardedGradients:
    """This rank's shard of every objective's reduced gradient, reduced layer by layer during the backward pass
    (:meth:`backward`), and the Gram, combination and dot products formed from the shards: the same answers as
    :class:`PerObjectiveGradients` after an all-reduce of its buffers, to float32 round-off (the sums run in
    another order). ``collector`` must be built with ``dense_in_buffer=False``."""

    def __init__(self, collector: PerObjectiveGradients, rank: int, world_size: int):
        if collector.sink is not None or collector.width:
            raise ValueError("ShardedGradients needs a PerObjectiveGradients built with dense_in_buffer=False")
        self.collector = collector
        self.num_objectives = collector.num_objectives
        self.rank, self.world_size = rank, world_size
        self.layers: list[_Layer] = []
        self.columns: dict[torch.Tensor, tuple[int, int, int, int]] = {}  # param -> shard [s0, s1), own [q0, q1)
        base = 0
        for module in collector.modules:
            params = tuple(
                p for p in module.parameters(recurse=False) if p in collector.names and p not in collector.sparse
            )
            if not params:
                continue
            offsets = tuple(sum(full_numel(q) for q in params[:i]) for i in range(len(params)))
            size = sum(full_numel(p) for p in params)
            part = -(-size // world_size)
            layer = _Layer(module, params, offsets, size, part, base)
            self.layers.append(layer)
            first, last = rank * part, (rank + 1) * part  # this rank's columns of the module's row
            for p, offset in zip(params, offsets):
                start, stop = max(first, offset), min(last, offset + full_numel(p))
                if start < stop:
                    self.columns[p] = (base + start - first, base + stop - first, start - offset, stop - offset)
            base += part
        self.layer_of = {layer.module: i for i, layer in enumerate(self.layers)}
        # each dense parameter's layer and its offset in the layer's row
        self.place = {
            p: (i, offset) for i, layer in enumerate(self.layers) for p, offset in zip(layer.params, layer.offsets)
        }
        self.dense = [p for layer in self.layers for p in layer.params]
        device = collector.flat.device
        self.shard = torch.zeros(self.num_objectives, base, dtype=collector.dtype, device=device)
        self.peak_staging_bytes = 0  # the most staging memory in flight at once, since construction
        self._staging: dict[int, torch.Tensor] = {}
        self._row_of: dict[int, int] = {}
        self._present: torch.Tensor = torch.zeros(0, dtype=torch.long)
        self._queue: list[int] = []
        self._pending: list[int] = [0] * len(self.layers)
        self._outputs: list[tuple[nn.Module, torch.Tensor]] = []
        collector.sink = self

    # -- the backward pass ------------------------------------------------------------------------------
    def zero(self) -> None:
        """Start a new optimizer step (with :meth:`PerObjectiveGradients.zero`)."""
        self.shard.zero_()

    def backward(self, loss: torch.Tensor, counts: torch.Tensor) -> None:
        """``loss.backward()`` with every layer's per-objective gradients reduce-scattered into the shard as the
        pass completes it; ``counts``: this rank's examples of each objective in the micro-batch."""
        fires = self._firing_layers(loss)
        agreed = torch.cat([counts.detach().double().cpu().reshape(-1), fires])
        torch.distributed.all_reduce(agreed)
        self._present = (agreed[: self.num_objectives] > 0).nonzero(as_tuple=True)[0]
        self._row_of = {int(t): i for i, t in enumerate(self._present)}
        anywhere = agreed[self.num_objectives :] > 0
        self._queue = [i for i in reversed(range(len(self.layers))) if bool(anywhere[i])]
        self._pending = [int(n) for n in fires.tolist()]
        try:
            loss.backward()
        finally:
            self._outputs = []
        for i in list(self._queue):  # the layers whose hook did not fire here (or out of order): same order
            self._pending[i] = 0
        self._flush()
        if self._staging:
            raise RuntimeError("per-objective gradients written outside the layers agreed on for this micro-batch")

    def forwarded(self, module: nn.Module, output: torch.Tensor) -> None:
        if module in self.layer_of:
            self._outputs.append((module, output))

    def block(self, param: torch.Tensor, objectives: list[int]) -> tuple[torch.Tensor, list[int]]:
        """The staging columns of a dense parameter (a row per objective present) and the rows of ``objectives``."""
        i, offset = self.place[param]
        stage = self._staging.get(i)
        if stage is None:
            stage = self._staging[i] = self._zeros(self.layers[i])
            in_flight = sum(s.numel() * s.element_size() for s in self._staging.values())
            self.peak_staging_bytes = max(self.peak_staging_bytes, in_flight)
        return stage[:, offset : offset + full_numel(param)], [self._row_of[t] for t in objectives]

    def _zeros(self, layer: _Layer) -> torch.Tensor:
        """A layer's staging buffer: a row per objective present in the micro-batch, N parts of columns."""
        shape = (len(self._present), self.world_size * layer.part)
        return torch.zeros(shape, dtype=self.shard.dtype, device=self.shard.device)

    def accumulated(self, module: nn.Module) -> None:
        i = self.layer_of.get(module)
        if i is not None:
            self._pending[i] -= 1
            self._flush()

    def _flush(self) -> None:
        """Reduce the layers at the head of the agreed order that this rank has completed."""
        while self._queue and self._pending[self._queue[0]] <= 0:
            self._reduce(self._queue.pop(0))

    def _reduce(self, i: int) -> None:
        layer, rows = self.layers[i], len(self._present)
        stage = self._staging.pop(i, None)
        if stage is None:  # the layer did not run on this rank: it adds nothing
            stage = self._zeros(layer)
        # column block r of every row must be contiguous for reduce-scatter: (rows, N, part) -> (N, rows, part)
        send = stage.view(rows, self.world_size, layer.part).transpose(0, 1).contiguous()
        del stage
        received = torch.empty(rows, layer.part, dtype=send.dtype, device=send.device)
        reduce_scatter(received.view(-1), send.view(-1))  # gloo splits along the first dimension
        self.shard[:, layer.base : layer.base + layer.part].index_add_(0, self._present.to(received.device), received)

    def _firing_layers(self, loss: torch.Tensor) -> torch.Tensor:
        """How many of this micro-batch's calls of each layer have an output the loss depends on: the gradient
        hooks the backward pass will run here (walking the autograd graph from the loss)."""
        nodes: dict[int, object] = {}  # by id, holding each node (so that no id is reused while we compare)
        leaves: set[int] = set()
        stack = [loss.grad_fn]
        while stack:
            node = stack.pop()
            if node is None or id(node) in nodes:
                continue
            nodes[id(node)] = node
            variable = getattr(node, "variable", None)  # AccumulateGrad: the leaf it writes
            if variable is not None:
                leaves.add(id(variable))
            stack.extend(next_node for next_node, _ in node.next_functions)
        fires = torch.zeros(len(self.layers), dtype=torch.float64)
        for module, output in self._outputs:
            reached = id(output.grad_fn) in nodes if output.grad_fn is not None else id(output) in leaves
            fires[self.layer_of[module]] += float(reached)
        return fires

    # -- after the backward passes -----------------------------------------------------------------------
    def gram(self, params: list[nn.Parameter], only_rows: OnlyRows = None, metric: Metric = None) -> torch.Tensor:
        """G_ts = ḡ_tᵀ ḡ_s (or ḡ_tᵀ P ḡ_s) over ``params``, as :meth:`PerObjectiveGradients.gram` of the reduced
        buffers: this shard's blocks, an all-reduce of the T × T partial Grams (float64), then the row-sparse
        weights' part, which every rank holds whole."""
        partial = gram_of_blocks(self._blocks(set(params), metric), self.num_objectives)
        torch.distributed.all_reduce(partial)
        sparse = [p for p in params if p in self.collector.sparse]
        return partial + self.collector.gram(sparse, only_rows, metric) if sparse else partial

    def _blocks(self, params: set[nn.Parameter], metric: Optional[dict[torch.Tensor, torch.Tensor]]) -> list[Block]:
        """The shard's columns of ``params``, adjacent ones merged into one block (one matrix product)."""
        blocks: list[Block] = []
        run: Optional[list[int]] = None  # [start, stop) of the current block of adjacent shard columns
        diagonals: list[torch.Tensor] = []

        def close_run() -> None:
            nonlocal run, diagonals
            if run is not None:
                blocks.append((self.shard[:, run[0] : run[1]], torch.cat(diagonals) if metric is not None else None))
            run, diagonals = None, []

        for p in self.dense:
            if p not in params or p not in self.columns:
                close_run()
                continue
            s0, s1, q0, q1 = self.columns[p]
            if run is not None and run[1] == s0:
                run[1] = s1
            else:
                close_run()
                run = [s0, s1]
            if metric is not None:
                diagonals.append(metric[p].reshape(-1)[q0:q1].to(self.shard.device))
        close_run()
        return blocks

    def combine(self, weights: torch.Tensor) -> dict[torch.Tensor, torch.Tensor]:
        """Σ_t w_t ḡ_t for every parameter: formed on this shard, then all-gathered, so every rank holds the same
        full gradient; the row-sparse weights' from their whole buffers (zero on rows no rank touched). The step
        hands the engine :meth:`contribution` instead, which the engine's averaging turns into this without the
        all-gather of P floats; this is what that average is checked against."""
        local = weighted_sum(weights, self.shard)
        gathered = torch.empty(self.world_size * local.numel(), dtype=local.dtype, device=local.device)
        all_gather(gathered, local)
        gathered = gathered.view(self.world_size, -1)
        out = self.collector.combine(weights) if self.collector.sparse else {}
        return self._into_parameters(out, lambda layer: gathered[:, layer.base : layer.base + layer.part].reshape(-1))

    def contribution(self, weights: torch.Tensor) -> dict[torch.Tensor, torch.Tensor]:
        """This rank's share of Σ_t w_t ḡ_t for a gradient the engine averages over the ranks: N × this rank's part
        of every layer and zeros in the other ranks' parts; the row-sparse weights' whole combination (the same on
        every rank) × N on rank 0 and zeros on the others. Every coordinate is then non-zero on one rank at most,
        so the engine's sum over the ranks adds zeros only and is exact in any reduction order, and its average is
        :meth:`combine`'s result up to the scaling: DeepSpeed multiplies by 1/N or divides by N (before or after
        the sum, depending on the stage), and (N·x)/N = x bit for bit when N is a power of two -- scaling by a power
        of two only shifts the exponent (barring overflow and subnormals) -- while for other N both N·x and the
        division round, leaving x to within an ulp or two, round-off far below the gradients' own."""
        local = weighted_sum(weights, self.shard) * self.world_size
        out = self.collector.combine(weights) if self.collector.sparse else {}
        for value in out.values():  # the row-sparse weights' (formed on their touched rows only: cheap to drop)
            if self.rank == 0:
                value.mul_(self.world_size)
            else:
                value.zero_()

        def own_part(layer: _Layer) -> torch.Tensor:
            row = torch.zeros(self.world_size * layer.part, dtype=local.dtype, device=local.device)
            row[self.rank * layer.part : (self.rank + 1) * layer.part] = local[layer.base : layer.base + layer.part]
            return row

        return self._into_parameters(out, own_part)

    def _into_parameters(
        self, out: dict[torch.Tensor, torch.Tensor], layer_row: Callable[[_Layer], torch.Tensor]
    ) -> dict[torch.Tensor, torch.Tensor]:
        """``out`` plus every layer's parameters, cut from ``layer_row(layer)``: the layer's N parts in rank order."""
        for layer in self.layers:
            row = layer_row(layer)
            for p, offset in zip(layer.params, layer.offsets):
                out[p] = row[offset : offset + full_numel(p)].view(full_shape(p))
        return out

    def dot(self, vectors: dict[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """(ḡ_tᵀ v)_t in float64, as :meth:`PerObjectiveGradients.dot`: this shard's part, all-reduced, then the
        row-sparse weights'."""
        out = torch.zeros(self.num_objectives, dtype=torch.float64)
        for p, (s0, s1, q0, q1) in self.columns.items():
            if p in vectors:
                out += matvec(self.shard[:, s0:s1], vectors[p].reshape(-1)[q0:q1])
        torch.distributed.all_reduce(out)
        return out + self.collector.dot(vectors) if self.collector.sparse else out
