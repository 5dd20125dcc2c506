"""The optimizer step of Gram-based weightings (LF-MLF and the comparison methods), read top to bottom in
:meth:`GramWeightedStep.__call__`:

1. For each micro-batch, the per-objective forward and backward pass into the step's gradient store
   (:class:`~mtft.gradients.store.GradientStore`: T × P buffers, sharded buffers, a tape, or the Gram formed during
   the backward pass -- chosen once by :func:`mtft.training.gradient_store.gradient_store`).
2. Reduce the store and all-reduce the loss sums and counts: the buffers hold the gradients of the loss *sums*, and
   g_t = that / count_t exactly, for the whole optimizer step (all micro-batches, all ranks). The 1/count_t scales
   are folded into the Gram (D G D) and the weights instead of a pass over the T × P buffers.
3. Gram of the shared parameters → weights w (objectives absent from the step are dropped). A Gram that holds NaN or
   inf is refused by the solver: the step is skipped on every rank alike, and logged.
4. Write the update: one backward pass of the surrogate Σ_θ ⟨θ, c_θ⟩, whose gradient is the store's contribution c
   -- Σ_t w_t g_t, or on sharded ranks this rank's part of it × N, zeros elsewhere, which the engine's own
   averaging over the ranks completes (:meth:`mtft.gradients.ShardedGradients.contribution`). It goes through
   ``engine.backward`` so DeepSpeed's gradient hooks, reduction and clipping run as usual, then ``engine.step()``.

Two options (:class:`StepOptions`, from ``gradients.metric`` and ``gradients.descent_check``):

- ``metric``: an :class:`~mtft.training.adamw_preconditioner.AdamWPreconditioner` forms the Gram in the
  optimizer's metric, G_ts = g_tᵀ P g_s with P = diag(1/(√v̂+ε)) AdamW's preconditioner (the Euclidean Gram
  before the first step and with SGD). The combined gradient Σ_t w_t g_t is unchanged: AdamW applies P to it
  itself. ZeRO stages 0-2 only (refused under ZeRO-3: :func:`mtft.training.engine.deepspeed_config`).
- ``descent_check``: after ``engine.step()``, the first-order change of every objective's loss under the update
  actually applied, g_tᵀΔθ with Δθ = θ_{k+1} − θ_k over every trainable parameter (T dot products), and whether
  all of them are negative. The same step then also serves weightings that read no Gram (none is formed). Under
  ZeRO-3 θ_k and θ_{k+1} are gathered whole for it (a full copy of the trainable parameters held over the step).

``cosine_every``: every that many steps the result carries the objectives' gradient cosines.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from mtft.core.distributed import all_reduce_sum
from mtft.core.errors import Diverged
from mtft.gradients.store import GradientStore
from mtft.pareto import SolverInputError
from mtft.training.adamw_preconditioner import AdamWPreconditioner
from mtft.training.step import StepResult, drain_regularisers
from mtft.weighting import Weighting


@dataclass(frozen=True)
class StepOptions:
    """What the step measures beside the update (module docstring)."""

    cosine_every: int = 0
    metric: Optional[AdamWPreconditioner] = None
    descent_check: bool = False


class GramWeightedStep:
    def __init__(self, store: GradientStore, weighting: Weighting, options: StepOptions = StepOptions()):
        self.store, self.weighting, self.options = store, weighting, options
        self.engine = store.model.engine
        self.num_objectives = store.num_objectives
        self.world_size = store.world_size
        self.steps = 0

    def __call__(self, micro_batches) -> StepResult:
        start = time.perf_counter()
        extras: dict[str, float] = {}
        self.store.zero(self._metric_diagonal(extras))
        sums, counts, examples = self._zeros(), self._zeros(), 0
        for batch in micro_batches:
            batch_sums, batch_counts = self.store.backward(batch)
            sums += batch_sums.detach().double().cpu()
            counts += batch_counts.detach().double().cpu()
            examples += batch["input_ids"].shape[0] * self.world_size
        extras["backward_s"] = time.perf_counter() - start
        counts, sums = all_reduce_sum(counts), all_reduce_sum(sums)
        present = counts > 0
        self.store.reduce()
        scale = torch.where(present, 1.0 / counts.clamp(min=1), 0.0)
        losses = torch.where(present, sums / counts.clamp(min=1), torch.nan)
        extras.update(drain_regularisers(self.engine.module))
        if self.store.shards > 1:  # the ranks the per-objective gradients were sharded over
            extras["gram_shards"] = float(self.store.shards)
        gram = self._timed(extras, "gram_s", self._gram, scale) if self.weighting.needs_gram else None
        sub = None if gram is None else gram[present][:, present].numpy()
        weights = self._zeros()
        try:
            weights[present] = self._weights(losses[present].numpy(), sub, extras)
        except SolverInputError as error:  # a NaN/inf Gram: skip the step on every rank alike
            self.steps += 1
            self.store.release()
            return StepResult(losses, counts, weights, float("nan"), examples, extras, skipped=str(error))
        update_start = time.perf_counter()
        combined = self.store.contribution(weights * scale)
        extras["combine_s"] = time.perf_counter() - update_start
        before = self.store.write(combined, keep=self.options.descent_check)
        del combined
        if before is None:
            self.store.release()  # the store's last use (the descent check reads it after the step)
        self._timed(extras, "optimizer_s", self.engine.step)
        self.steps += 1
        extras.update(self.weighting.state())
        first_order = None if before is None else self._first_order(before, scale, present, extras)
        cosines = self._summaries(gram, sub, weights[present].numpy(), present, extras)
        extras["step_s"] = time.perf_counter() - start
        loss = float((weights[present] * losses[present]).sum())
        return StepResult(
            losses, counts, weights, loss, examples, extras, first_order, weighting_row=True, cosines=cosines
        )

    def _zeros(self) -> torch.Tensor:
        return torch.zeros(self.num_objectives, dtype=torch.float64)

    def _metric_diagonal(self, extras: dict[str, float]):
        """The Gram's diagonal metric (None: Euclidean), from the optimizer's state before this step's update."""
        if not (self.weighting.needs_gram and self.options.metric is not None):
            return None
        diagonal = self.options.metric.diagonal(self.store.shared)
        extras["metric_preconditioned"] = float(diagonal is not None)
        return diagonal

    def _gram(self, scale: torch.Tensor) -> torch.Tensor:
        """The Gram of the g_t = (gradient of the loss sum) / count_t: the store's, scaled on both sides."""
        return self.store.gram() * scale[:, None] * scale[None, :]

    @staticmethod
    def _timed(extras: dict[str, float], key: str, run, *args):
        """``run(*args)``, its seconds in ``extras[key]``."""
        begin = time.perf_counter()
        out = run(*args)
        extras[key] = time.perf_counter() - begin
        return out

    def _weights(self, losses: np.ndarray, gram: Optional[np.ndarray], extras: dict[str, float]) -> torch.Tensor:
        """The weighting's w over the present objectives; non-finite weights stop the run (applied, they would turn
        every trainable weight into NaN)."""
        solve_start = time.perf_counter()
        w = np.asarray(self.weighting(losses, gram), dtype=np.float64)
        extras["weighting_s"] = time.perf_counter() - solve_start
        if not np.isfinite(w).all():
            raise Diverged(
                f"weighting {self.weighting.name} returned non-finite weights at step {self.steps + 1} "
                f"({np.array2string(w, precision=3, threshold=8)}); the update was not applied"
            )
        return torch.as_tensor(w)

    def _first_order(self, before, scale, present, extras: dict[str, float]) -> torch.Tensor:
        """The descent check: g_tᵀΔθ of the update ``engine.step()`` applied (NaN for absent objectives)."""
        first_order = self.store.first_order(before) * scale
        first_order[~present] = torch.nan
        extras.update(_descent_summary(first_order[present]))
        self.store.release()
        return first_order

    def _summaries(self, gram, sub, w: np.ndarray, present, extras: dict[str, float]):
        """The Gram's summaries into ``extras``; the cosines every ``cosine_every`` steps (else None)."""
        if sub is None or gram is None:
            return None
        extras.update(_gram_summary(sub, w))
        every = self.options.cosine_every
        return _cosines(gram.numpy(), present.numpy()) if every and self.steps % every == 0 else None


def _descent_summary(changes: torch.Tensor) -> dict[str, float]:
    """Of the present objectives' first-order changes g_tᵀΔθ: whether all decrease (common descent), the
    fraction that do, and the largest (the objective the update serves worst; > 0: it increases)."""
    return {
        "common_descent": float(bool((changes < 0).all())),
        "descent_fraction": float((changes < 0).double().mean()),
        "max_first_order": float(changes.max()),
    }


def _gram_summary(gram: np.ndarray, w: np.ndarray) -> dict[str, float]:
    """||d||² and the Pareto-stationarity gauge ||d||² / mean_t ||g_t||² (Mao et al., 2022, Theorem 3)."""
    d_sq = float(w @ gram @ w)
    mean_sq = float(np.mean(np.diag(gram)))
    return {"d_norm_sq": d_sq, "mean_grad_norm_sq": mean_sq, "stationarity": d_sq / mean_sq if mean_sq > 0 else 0.0}


def _cosines(gram: np.ndarray, present: np.ndarray) -> list[list[float | None]]:
    norms = np.sqrt(np.clip(np.diag(gram), 0, None))
    out = []
    for t in range(len(gram)):
        row = []
        for s in range(len(gram)):
            ok = present[t] and present[s] and norms[t] > 0 and norms[s] > 0
            row.append(float(gram[t, s] / (norms[t] * norms[s])) if ok else None)
        out.append(row)
    return out
