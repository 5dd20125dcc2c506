"""A toy model and per-rank batches for the sharded (reduce-scattered) per-objective gradients, and the ZeRO-3
partitioning of a model's parameters."""

from __future__ import annotations

import torch
from torch import nn

from mtft.core.rows import labelled_rows

OBJECTIVES = 4  # the last is absent from every rank's rows: its shard stays zero


class Toy(nn.Module):
    """Every kind of buffer: a row-sparse embedding (with a padding row), dense LayerNorm and Linear parameters in
    odd sizes (layers split unevenly over the ranks), a layer whose output the loss ignores (as a pooler no head
    reads), and a second head that runs only when objective 2 has rows -- on some ranks and micro-batches only."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(37, 5, padding_idx=0)
        self.norm = nn.LayerNorm(5)
        self.hidden = nn.Linear(5, 7)
        self.unused = nn.Linear(5, 3)
        self.out = nn.Linear(7, 3)
        self.other = nn.Linear(7, 3)

    def forward(self, ids: torch.Tensor, objective: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        with labelled_rows(objective=objective):
            h = self.norm(self.embedding(ids)).mean(1)
            self.unused(h)
            features = torch.tanh(self.hidden(h))
            logits = self.out(features)
            second = objective == 2
            if second.any():
                with labelled_rows(objective=objective[second]):
                    logits = logits.index_put((second,), self.other(features[second]), accumulate=True)
        losses = nn.functional.cross_entropy(logits, labels, reduction="none")
        return torch.zeros(OBJECTIVES).index_add(0, objective, losses)


def _rank_batch(rank: int, micro: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(100 + 10 * rank + micro)
    rows = 6 + 3 * rank  # unequal ranks
    ids = torch.randint(0, min(20 + 10 * rank, 37), (rows, 4), generator=generator)  # rank 1: rows rank 0 not
    high = 2 if (rank, micro) == (0, 0) else OBJECTIVES - 1  # objective 2 (the second head) absent there
    objective = torch.randint(0, high, (rows,), generator=generator).sort().values
    return ids, objective, torch.randint(0, 3, (rows,), generator=generator)


def as_partitioned(model: torch.nn.Module) -> dict[torch.nn.Parameter, torch.Tensor]:
    """Mark every parameter as ZeRO-3 marks it and empty its data, as a partitioned parameter's is between passes;
    returns the data to put back."""
    data = {}
    for i, p in enumerate(model.parameters()):
        p.ds_id, p.ds_shape, p.ds_numel = i, p.shape, p.numel()
        data[p] = p.data
        p.data = torch.empty(0, dtype=p.dtype)
    return data
