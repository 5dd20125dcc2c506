"""Multi-objective sampling: which objective each example of a training batch comes from.

Mixing probabilities over objectives with sizes n_t (each counted at most ``cap`` times):

- ``proportional``: p_t ∝ n_t
- ``temperature``:  p_t ∝ n_t^(1/T)   (T = 1 is proportional, T → ∞ uniform; Arivazhagan et al. 2019)
- ``uniform``:      p_t = 1/T_objectives

Each batch slot draws its objective i.i.d. from p, so a batch may hold several objectives; within an
objective, rows are visited in a fresh random permutation per pass. Everything is a function of the seed and
a small state (batch counter, per-objective cursor and pass), so a resumed run draws exactly the batches an
uninterrupted run would, and every data-parallel rank draws the same global batch.

With ``data.leave_out`` an objective's rows are a subset of a whole split (``kept``: their positions in it); a
pass then visits the whole split's permutation with the other rows skipped, so that the run on S^i sees the
batches of the run on S less the removed rows (:func:`mtft.data.leave_out.kept_order`).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from mtft.data.leave_out import kept_order


def mixing_probabilities(
    sizes: Sequence[int], strategy: str, temperature: float = 1.0, cap: Optional[int] = None
) -> np.ndarray:
    counts = np.asarray(sizes, dtype=np.float64)
    if counts.ndim != 1 or counts.size == 0 or (counts <= 0).any():
        raise ValueError(f"every objective needs at least one example, got sizes {list(sizes)}")
    if cap is not None:
        counts = np.minimum(counts, cap)
    if strategy == "uniform":
        weights = np.ones_like(counts)
    elif strategy == "proportional":
        weights = counts
    elif strategy == "temperature":
        weights = counts ** (1.0 / temperature)
    else:
        raise ValueError(f"unknown mixing strategy {strategy!r}")
    return weights / weights.sum()


class MultiObjectiveSampler:
    """Draws global batches of (objective, row) pairs."""

    def __init__(
        self,
        sizes: Sequence[int],
        probabilities: Sequence[float],
        batch_size: int,
        seed: int,
        kept: Optional[Sequence[Optional[np.ndarray]]] = None,
        full_sizes: Optional[Sequence[int]] = None,
    ):
        """``kept[t]`` (with ``full_sizes[t]``, the whole split's row count): objective t's rows are these positions
        of a split of that many rows; None (or no ``kept``): its rows are the whole split."""
        self.sizes = [int(n) for n in sizes]
        self.kept = list(kept) if kept is not None else [None] * len(self.sizes)
        self.full_sizes = [int(n) for n in full_sizes] if full_sizes is not None else list(self.sizes)
        for t, rows in enumerate(self.kept):
            if rows is not None and len(rows) != self.sizes[t]:
                raise ValueError(f"objective {t}: {len(rows)} kept rows for a size of {self.sizes[t]}")
        self.probabilities = np.asarray(probabilities, dtype=np.float64)
        self.batch_size = batch_size
        self.seed = seed
        self.batches_drawn = 0
        self.cursor = [0] * len(self.sizes)
        self.passes = [0] * len(self.sizes)
        self._orders = [self._order(t) for t in range(len(self.sizes))]

    def _order(self, objective: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, 1, objective, self.passes[objective]])
        kept = self.kept[objective]
        if kept is None:
            return rng.permutation(self.sizes[objective])
        return kept_order(rng.permutation(self.full_sizes[objective]), kept)

    def next_batch(self) -> list[tuple[int, int]]:
        rng = np.random.default_rng([self.seed, 0, self.batches_drawn])
        objectives = rng.choice(len(self.sizes), size=self.batch_size, p=self.probabilities)
        self.batches_drawn += 1
        return [(int(t), self._next_row(int(t))) for t in objectives]

    def _next_row(self, objective: int) -> int:
        if self.cursor[objective] == self.sizes[objective]:
            self.cursor[objective] = 0
            self.passes[objective] += 1
            self._orders[objective] = self._order(objective)
        row = int(self._orders[objective][self.cursor[objective]])
        self.cursor[objective] += 1
        return row

    def state_dict(self) -> dict:
        return {"batches_drawn": self.batches_drawn, "cursor": list(self.cursor), "passes": list(self.passes)}

    def load_state_dict(self, state: dict) -> None:
        if len(state["cursor"]) != len(self.sizes):
            raise ValueError("sampler state is for a different set of objectives")
        self.batches_drawn = int(state["batches_drawn"])
        self.cursor = [int(c) for c in state["cursor"]]
        self.passes = [int(p) for p in state["passes"]]
        self._orders = [self._order(t) for t in range(len(self.sizes))]
