"""A row-sparse weight's per-objective gradients keep the touched rows only: slots handed out as rows appear,
grown without losing what they hold, zeroed when reused after a step is cleared; the dense view they stand for is
the ordinary accumulation, and the memory follows the rows touched, not the table."""

from __future__ import annotations

import torch
from torch import nn

from mtft.core.rows import labelled_rows
from mtft.gradients import PerObjectiveGradients
from mtft.gradients.row_sparse import RowSparseBuffer


def test_slots_grow_keep_their_values_and_are_zeroed_when_reused():
    weight = torch.zeros(50, 3)
    buffer = RowSparseBuffer(weight, num_objectives=2, dtype=torch.float64, capacity=2)
    expected = torch.zeros(2, 50, 3, dtype=torch.float64)
    generator = torch.Generator().manual_seed(0)
    for rows in ([4, 9, 4], [9, 30, 31, 32, 33], [0, 49]):  # repeats, then growth past 2 and 4 slots
        index = torch.tensor(rows)
        values = torch.randn(2, len(rows), 3, generator=generator, dtype=torch.float64)
        slots = buffer.slots(index)
        for t in range(2):
            buffer.store[t].index_add_(0, slots, values[t])
            expected[t].index_add_(0, index, values[t])
    torch.testing.assert_close(buffer.full(), expected)
    assert buffer.touched().tolist() == [0, 4, 9, 30, 31, 32, 33, 49]
    assert buffer.store.shape[1] <= 16  # doubled as needed, never the 50 rows
    torch.testing.assert_close(buffer.block(torch.tensor([33, 4])), expected[:, [33, 4]])

    buffer.clear()
    assert len(buffer.touched()) == 0 and (buffer.full() == 0).all()
    slot = buffer.slots(torch.tensor([7]))  # reuses slot 0, which held row 4's sums
    assert slot.tolist() == [0] and (buffer.store[:, 0] == 0).all()


class Lookup(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(5000, 8)
        self.out = nn.Linear(8, 1)

    def forward(self, ids: torch.Tensor, objective: torch.Tensor) -> torch.Tensor:
        with labelled_rows(objective=objective):
            loss = self.out(self.embedding(ids).mean(1)).squeeze(-1) ** 2
        return torch.zeros(3, dtype=loss.dtype).index_add(0, objective, loss)


def test_an_embedding_table_costs_its_touched_rows_and_matches_the_ordinary_gradient():
    torch.manual_seed(0)
    model = Lookup()
    ids = torch.randint(0, 5000, (6, 5))
    objective = torch.tensor([0, 0, 1, 1, 2, 2])
    collector = PerObjectiveGradients(model, 3).attach()
    detached = {n: p.detach() for n, p in model.named_parameters()}
    with collector.capturing():
        sums = torch.func.functional_call(model, detached, args=(ids, objective))
    sums.sum().backward()
    collector.finalize()
    table = model.embedding.weight
    assert collector.sparse[table].nbytes <= 3 * 64 * 8 * 4  # 64 slots (≥ the ≤ 30 rows touched), not 5000 rows
    for t in range(3):
        model.zero_grad()
        model(ids, objective)[t].backward()
        torch.testing.assert_close(collector.gradient(table)[t], table.grad)
        torch.testing.assert_close(collector.gradient(model.out.weight)[t], model.out.weight.grad)
    assert collector.touched_rows(table).tolist() == torch.unique(ids).tolist()


def test_a_restricted_buffer_keeps_its_window_and_discards_the_rest():
    """restrict(): the window's rows get slots, every other row the one discard slot past them, never read back;
    outside_rows() says which rows were asked for outside; the store is sized to the window (no doubling)."""
    weight = torch.zeros(10, 3)
    buffer = RowSparseBuffer(weight, 2, torch.float64, capacity=1)
    inside = torch.zeros(10, dtype=torch.bool)
    inside[[2, 7]] = True
    buffer.restrict(inside)
    assert buffer.store.shape[1] == 3  # two rows and the discard slot
    rows = torch.tensor([7, 1, 2, 7, 9])
    slots = buffer.slots(rows)
    store = buffer.store.view(-1, 3)
    store.index_add_(0, slots, torch.ones(5, 3, dtype=torch.float64))  # objective 0's rows (slot = index)
    used_rows, block = buffer.used()
    assert used_rows.tolist() == [2, 7] and block.shape == (2, 2, 3)
    assert block[0, 0].tolist() == [1.0] * 3 and block[0, 1].tolist() == [2.0] * 3 and not block[1].any()
    assert slots[1] == slots[4] == buffer.store.shape[1] - 1  # the discard slot
    assert buffer.outside_rows().tolist() == [1, 9]
    buffer.clear()
    buffer.restrict(None)
    assert buffer.outside_rows().numel() == 0 and buffer.slots(torch.tensor([1])).tolist() == [0]
