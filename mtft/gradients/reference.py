"""The slow, obviously correct per-objective gradients: one ``torch.autograd.grad`` call per objective.

Kept as the reference that tests hold :class:`mtft.gradients.PerObjectiveGradients` to (in float64), and as
the "naive" baseline of ``bench/lfmlf_step.py``.
"""

from __future__ import annotations

import torch
from torch import nn


def reference_objective_gradients(
    model: nn.Module, batch: dict[str, torch.Tensor], params: list[nn.Parameter], num_objectives: int
) -> torch.Tensor:
    """(T, P) gradients of each objective's *summed* loss with respect to ``params`` (flattened, in order)."""
    sums, _ = model(**batch)
    rows = []
    for t in range(num_objectives):
        grads = torch.autograd.grad(sums[t], params, retain_graph=True, allow_unused=True)
        rows.append(torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1) for g, p in zip(grads, params)]))
    return torch.stack(rows)
