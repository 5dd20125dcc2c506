"""The per-objective gradients of the global batch, sharded over data-parallel ranks.

The Gram of the rank-averaged gradients is G_ts = ⟨Σ_r g_t^r, Σ_r g_s^r⟩ (up to the 1/count scales the step folds
in) -- not the sum of the ranks' local Grams, so it needs the reduced gradients. It does not need all of them on
every rank: a Gram is a sum over coordinates, G = Σ_shards G^(shard). So

1. each objective's buffer row is *reduce-scattered* (one reduce-scatter of P floats per objective present in the
   step): rank r then holds shard r (P/N columns) of every ḡ_t, T × P/N floats;
2. rank r forms its partial Gram on its shard (the same blocks -- shared parameters, touched embedding rows, the
   optimizer's metric -- restricted to its columns, each product in the buffers' dtype, summed in float64 as the
   unsharded Gram is) and the T × T partials are all-reduced: T² floats;
3. every rank solves the same Gram for the same weights w;
4. rank r combines Σ_t w_t ḡ_t on its shard and the shards are all-gathered (P floats) into the gradient the
   optimizer steps with, identical on every rank.

Per step that is T reduce-scatters + a T × T all-reduce + one all-gather of P, against an all-reduce of T × P
(about twice T reduce-scatters in a ring or halving-doubling algorithm) in the unsharded path, and the Gram's
T² · P/N multiply-adds per rank instead of T² · P.

Memory: the backward pass writes every objective's gradient of this rank's rows into the T × P accumulation
buffer of :class:`PerObjectiveGradients` before anything can be reduced, so that buffer stays; the reduced shard
is written back into this rank's own columns of it (through one P/N landing row: a collective never reads and
writes the same memory), so sharding adds P/N floats, not T × P/N. Making the per-rank buffer fall as 1/N needs
the reduce-scatter inside the backward pass, layer by layer (ZeRO-2's gradient buckets), which this does not do.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from mtft.core.distributed import all_gather, reduce_scatter
from mtft.gradients.per_objective import PerObjectiveGradients, gram_of_blocks, matvec, weighted_sum

Block = tuple[torch.Tensor, Optional[torch.Tensor]]


class ShardedGradients:
    """This rank's shard of every objective's reduced gradient, and the Gram, combination and dot products
    formed from the shards: the same answers as :class:`PerObjectiveGradients` after an all-reduce of its
    buffers, to float32 round-off (the sums run in another order)."""

    def __init__(self, collector: PerObjectiveGradients, rank: int, world_size: int):
        width = collector.flat.shape[1]
        if width % world_size:
            raise ValueError(f"the buffers' width {width} is not a multiple of {world_size} ranks (pad_multiple)")
        self.collector = collector
        self.num_objectives = collector.num_objectives
        self.world_size = world_size
        size = width // world_size
        self.start, self.stop = rank * size, (rank + 1) * size  # this rank's columns of the flat buffers
        # After reduce(): ḡ_t on this rank's columns, a view of the accumulation buffer (the other columns then
        # hold this rank's local sums, which nothing reads before the next step's backward overwrites them).
        self.shard = collector.flat[:, self.start : self.stop]
        self._landing = torch.empty(size, dtype=collector.flat.dtype, device=collector.flat.device)

    def reduce(self, present: torch.Tensor) -> None:
        """Reduce-scatter the rows of the objectives in ``present`` (the same on every rank: it comes from the
        all-reduced counts); the others have no example in the step anywhere, so their rows are zero."""
        for t in range(self.num_objectives):
            if bool(present[t]):
                reduce_scatter(self._landing, self.collector.flat[t])
                self.shard[t].copy_(self._landing)
            else:
                self.shard[t].zero_()

    # ------------------------------------------------------------------------------------------------
    def gram(
        self,
        params: list[nn.Parameter],
        only_rows: Optional[dict[nn.Parameter, torch.Tensor]] = None,
        metric: Optional[dict[torch.Tensor, torch.Tensor]] = None,
    ) -> torch.Tensor:
        """G_ts = ḡ_tᵀ ḡ_s (or ḡ_tᵀ P ḡ_s) over ``params``, as :meth:`PerObjectiveGradients.gram` of the reduced
        buffers: this shard's blocks, then an all-reduce of the T × T partial Grams (float64)."""
        partial = gram_of_blocks(self._blocks(set(params), only_rows, metric), self.num_objectives)
        torch.distributed.all_reduce(partial)
        return partial

    def _blocks(
        self,
        params: set[nn.Parameter],
        only_rows: Optional[dict[nn.Parameter, torch.Tensor]],
        metric: Optional[dict[torch.Tensor, torch.Tensor]],
    ) -> list[Block]:
        """The columns of this shard that the Gram reads: adjacent dense parameters merged into one block (one
        matrix product, as the unsharded Gram takes the dense rest in one), each row-sparse weight over its
        touched (and ``only_rows``) rows."""
        blocks: list[Block] = []
        run: Optional[list[int]] = None  # [start, stop) of the current block of adjacent dense columns
        run_diagonal: list[torch.Tensor] = []

        def close_run() -> None:
            nonlocal run, run_diagonal
            if run is not None:
                diagonal = torch.cat(run_diagonal) if metric is not None else None
                blocks.append((self.shard[:, run[0] - self.start : run[1] - self.start], diagonal))
            run, run_diagonal = None, []

        for p, (first, last) in self.collector.spans.items():
            start, stop = max(first, self.start), min(last, self.stop)
            if p not in params or start >= stop:
                close_run()
                continue
            if p in self.collector.row_mask:
                close_run()
                blocks.append(self._row_sparse_block(p, first, start, stop, only_rows, metric))
                continue
            if run is not None and run[1] == start:
                run[1] = stop
            else:
                close_run()
                run = [start, stop]
            if metric is not None:
                run_diagonal.append(metric[p].reshape(-1)[start - first : stop - first])
        close_run()
        return blocks

    def _row_sparse_block(
        self,
        p: torch.Tensor,
        first: int,
        start: int,
        stop: int,
        only_rows: Optional[dict[nn.Parameter, torch.Tensor]],
        metric: Optional[dict[torch.Tensor, torch.Tensor]],
    ) -> Block:
        """The columns of this shard that belong to the Gram's rows of a row-sparse weight starting at column
        ``first`` (a row may straddle two shards: each takes its part)."""
        rows = self.collector.gram_rows(p, only_rows)
        row_width = p.numel() // p.shape[0]
        columns = (rows[:, None] * row_width + torch.arange(row_width, device=rows.device)).reshape(-1)
        columns = columns[(columns >= start - first) & (columns < stop - first)]
        block = self.shard[:, columns + (first - self.start)]
        return block, None if metric is None else metric[p].reshape(-1)[columns.to(metric[p].device)]

    # ------------------------------------------------------------------------------------------------
    def combine(self, weights: torch.Tensor) -> dict[torch.Tensor, torch.Tensor]:
        """Σ_t w_t ḡ_t for every parameter: formed on this shard, then all-gathered, so every rank holds the same
        full gradient (rows of a row-sparse weight that no rank touched are zero in every ḡ_t, so in the sum)."""
        local = weighted_sum(weights, self.shard)
        full = torch.empty(self.collector.flat.shape[1], dtype=local.dtype, device=local.device)
        all_gather(full, local)
        return {p: full[first:last].view_as(p) for p, (first, last) in self.collector.spans.items()}

    def dot(self, vectors: dict[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """(ḡ_tᵀ v)_t in float64, as :meth:`PerObjectiveGradients.dot` (one product per parameter, summed in
        float64): this shard's part, all-reduced."""
        out = torch.zeros(self.num_objectives, dtype=torch.float64)
        for p, (first, last) in self.collector.spans.items():
            start, stop = max(first, self.start), min(last, self.stop)
            if p in vectors and start < stop:
                v = vectors[p].reshape(-1)[start - first : stop - first]
                out += matvec(self.shard[:, start - self.start : stop - self.start], v)
        torch.distributed.all_reduce(out)
        return out
