"""Per-objective gradients of a weight whose step touches only some rows: the touched rows only.

An embedding table's gradient is zero outside the tokens a step looks up, a Multi-LoRA B stack's outside the
slots of the tasks in the batch. A dense (T, rows, ...) buffer would cost T × vocabulary × hidden floats --
37 GB at XLM-R's 250,002 × 768 and T = 48, whatever the batch -- for the few hundred rows a step touches. Here each
touched row gets a slot in a (T, slots, ...) store, grown as rows appear (doubling, at most the weight's rows);
clearing a step forgets the slots, and a slot is zeroed when it is handed out again.

The bufferless step forms a large table's products a window of rows at a time (:meth:`RowSparseBuffer.restrict`):
rows outside the window share one discard slot past the used ones, so that a layer's rule writes every row as
usual (it never learns of the window) while only the window's rows are kept.
"""

from __future__ import annotations

from typing import Optional

import torch

from mtft.gradients.shapes import full_shape


class RowSparseBuffer:
    def __init__(self, param: torch.Tensor, num_objectives: int, dtype: torch.dtype, capacity: int = 64):
        self.shape = tuple(full_shape(param))  # ZeRO-3: the partitioned weight's own shape
        self.num_objectives = num_objectives
        self.store = torch.zeros(num_objectives, min(capacity, self.shape[0]), *self.shape[1:], dtype=dtype)
        self.store = self.store.to(param.device)
        self.slot_of = torch.full((self.shape[0],), -1, dtype=torch.long, device=param.device)
        self.rows = torch.empty(0, dtype=torch.long, device=param.device)  # the touched rows, in slot order
        # restrict(): the rows that get slots (None: all); the others were asked for, and went to the discard slot
        self.inside: Optional[torch.Tensor] = None
        self.outside: list[torch.Tensor] = []

    @property
    def nbytes(self) -> int:
        return self.store.numel() * self.store.element_size()

    def clear(self) -> None:
        """Forget this step's rows (their slots are zeroed when handed out again)."""
        self.slot_of[self.rows] = -1
        self.rows = self.rows[:0]
        self.outside = []

    def restrict(self, inside: Optional[torch.Tensor]) -> None:
        """From now on only the rows where the boolean mask ``inside`` holds have slots, all handed out (zeroed) now,
        in row order (None: every row, a slot handed out as each comes); any other row's slot is the discard slot,
        the store's last, which is never read (:meth:`outside_rows` says which rows went there). Call after
        :meth:`clear`."""
        self.inside = None if inside is None else inside.to(self.slot_of.device)
        if self.inside is None:
            return
        window = self.inside.nonzero(as_tuple=True)[0]
        if self.store.shape[1] < len(window) + 1:  # the window and the discard slot: it never grows after
            self.store = self.store.new_empty(self.num_objectives, len(window) + 1, *self.shape[1:])
        self._hand_out(window)

    def slots(self, rows: torch.Tensor) -> torch.Tensor:
        """The slots of ``rows`` (a 1-D index tensor), giving zeroed slots to rows not touched before."""
        if self.inside is None:
            self._hand_out(torch.unique(rows[self.slot_of[rows] < 0]))
            return self.slot_of[rows]
        inside = self.inside[rows]
        self.outside.append(rows[~inside])
        discard = self.store.shape[1] - 1  # past the window's slots (restrict)
        return torch.where(inside, self.slot_of[rows], torch.full_like(rows, discard))

    def _hand_out(self, new: torch.Tensor) -> None:
        """Zeroed slots for the rows ``new`` (not holding one), the store grown as needed."""
        if not len(new):
            return
        used, needed = len(self.rows), len(self.rows) + len(new)
        if needed > self.store.shape[1]:
            grown = min(max(needed, 2 * self.store.shape[1]), self.shape[0])
            store = self.store.new_empty(self.num_objectives, grown, *self.shape[1:])
            store[:, :used] = self.store[:, :used]
            self.store = store
        self.store[:, used:needed] = 0
        self.slot_of[new] = torch.arange(used, needed, device=self.slot_of.device)
        self.rows = torch.cat([self.rows, new])

    def outside_rows(self) -> torch.Tensor:
        """The rows asked for outside the window of :meth:`restrict` since :meth:`clear`, sorted, once each."""
        if not self.outside:
            return self.rows[:0]
        return torch.unique(torch.cat(self.outside))

    def touched(self) -> torch.Tensor:
        """The rows touched this step, sorted (the same order on every rank whatever the slots' order)."""
        return torch.sort(self.rows).values

    def used(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The touched rows in slot order and their (T, rows, ...) gradients: a view, no copy. For sums over the rows
        (a Gram, a dot product) on one process, where their order moves only the round-off, and for per-row
        results (the combination) anywhere. Several ranks summing over rows use :meth:`touched` and :meth:`block`:
        their slot orders differ, and the ranks must get the same bits."""
        return self.rows, self.store[:, : len(self.rows)]

    def block(self, rows: torch.Tensor) -> torch.Tensor:
        """(T, len(rows), ...) gradients of the given touched rows (a copy)."""
        return self.store[:, self.slot_of[rows]]

    def write(self, rows: torch.Tensor, block: torch.Tensor) -> None:
        self.store[:, self.slot_of[rows]] = block

    def take_union_of_ranks(self) -> None:
        """Give this rank's buffer every row any rank touched (zero where this one touched none), as the buffer
        reduced over the ranks has: one collective, every rank in the same order of buffers."""
        union = torch.zeros(self.shape[0], dtype=torch.float32, device=self.slot_of.device)
        union[self.rows] = 1
        torch.distributed.all_reduce(union)
        self.slots(union.nonzero(as_tuple=True)[0])

    def all_reduce_touched(self) -> torch.Tensor:
        """Sum the touched rows' blocks over the ranks (after :meth:`take_union_of_ranks`); the rows, sorted."""
        rows = self.touched()
        if len(rows):
            block = self.block(rows).contiguous()
            torch.distributed.all_reduce(block)
            self.write(rows, block)
        return rows

    def full(self) -> torch.Tensor:
        """The (T, rows, ...) gradient, zero outside the touched rows (for tests and tools, not the step)."""
        out = torch.zeros(self.num_objectives, *self.shape, dtype=self.store.dtype, device=self.store.device)
        out[:, self.rows] = self.store[:, : len(self.rows)]
        return out
