"""One optimizer step: per-objective losses, their combination, backward, and the engine's step.

Per-objective losses are exact global means: each process sums its rows' losses per objective, the counts
are all-reduced, and L_t = Σ_ranks sum_t / count_t. Because DeepSpeed averages gradients over ranks, each
rank back-propagates world_size · sum_t / count_t, which makes the update identical to a single process
holding the whole global batch.

:class:`LossWeightedStep` serves weightings that decide from the losses alone. A weighting with
``needs_gram`` gets a step class that forms per-objective gradients of the shared parameters, accumulated
over the micro-batches of the optimizer step, and writes the combined gradient before ``engine.step()``: that
is :class:`mtft.training.gram_step.GramWeightedStep`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional

import torch

from mtft.core.distributed import all_reduce_sum
from mtft.weighting import Weighting


@dataclass
class StepResult:
    """What one optimizer step did: everything the loop logs and decides on, whatever the step's kind."""

    losses: torch.Tensor  # (T,) global mean loss per objective over the step (nan where absent)
    counts: torch.Tensor  # (T,) global loss units per objective
    weights: torch.Tensor  # (T,) weights applied (0 where absent)
    loss: float  # Σ_t w_t L_t
    examples: int  # global examples in the step
    extras: dict[str, float] = field(default_factory=dict)
    # (T,) first-order change g_tᵀΔθ of each objective's loss under the applied update (nan where absent), when
    # the step measured it (gradients.descent_check)
    first_order: Optional[torch.Tensor] = None
    skipped: Optional[str] = None  # why no update was applied (e.g. a NaN Gram); the loop logs it and goes on
    weighting_row: bool = False  # log the weights (and extras: ||d||², the certificate, g_tᵀΔθ) every step
    cosines: Optional[list[list[Optional[float]]]] = None  # the objectives' gradient cosines, when formed

    def rows(self, names: list[str]) -> list[tuple[str, dict]]:
        """The step's own rows of metrics.jsonl (kind, values), beside the train window's: the weighting's and the
        cosines'."""
        rows: list[tuple[str, dict]] = []
        if self.weighting_row:
            values: dict = {f"weight/{n}": w for n, w in zip(names, self.weights.tolist())}
            if self.first_order is not None:
                values.update({f"first_order/{n}": c for n, c in zip(names, self.first_order.tolist())})
            rows.append(("weighting", {**values, **self.extras}))
        if self.cosines is not None:
            rows.append(("cosines", {"objectives": names, "matrix": self.cosines}))
        return rows


class LossWeightedStep:
    def __init__(self, engine, weighting: Weighting, num_objectives: int, world_size: int):
        self.engine = engine
        self.weighting = weighting
        self.num_objectives = num_objectives
        self.world_size = world_size

    def __call__(self, micro_batches: Iterable[dict[str, torch.Tensor]]) -> StepResult:
        total_sums = torch.zeros(self.num_objectives, dtype=torch.float64)
        total_counts = torch.zeros(self.num_objectives, dtype=torch.float64)
        weights = torch.zeros(self.num_objectives, dtype=torch.float64)
        examples, micro_steps = 0, 0
        for batch in micro_batches:
            batch = {k: v.to(self.engine.device) for k, v in batch.items()}
            sums, counts = self.engine(**batch)
            global_sums = all_reduce_sum(sums.detach().double().cpu())
            global_counts = all_reduce_sum(counts.detach().double().cpu())
            present = global_counts > 0
            w = torch.from_numpy(self.weighting((global_sums[present] / global_counts[present]).numpy()))
            scale = (self.world_size / global_counts[present]).to(sums.dtype).to(sums.device)
            loss = (w.to(sums.dtype).to(sums.device) * sums[present] * scale).sum()
            self.engine.backward(loss)
            self.engine.step()
            total_sums += global_sums
            total_counts += global_counts
            weights[present] += w.double()
            examples += batch["input_ids"].shape[0] * self.world_size  # ranks hold equal micro-batches
            micro_steps += 1
        means = total_sums / total_counts  # nan where absent over the whole step
        weights /= micro_steps
        present = total_counts > 0
        combined = float((weights[present] * means[present]).sum())
        extras = {**self.weighting.state(), **drain_regularisers(self.engine.module)}
        return StepResult(means, total_counts, weights, combined, examples, extras)


def drain_regularisers(module) -> dict[str, float]:
    """The model's regulariser values over the step (``mmr/<task>``, :class:`mtft.models.multitask.MultiTaskModel`),
    for the train log; nothing for a module that keeps none."""
    drain = getattr(module, "drain_regularisers", None)
    return drain() if drain is not None else {}
