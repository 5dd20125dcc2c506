"""The optimizer step of Gram-based weightings (LF-MLF and the comparison methods).

1. For each micro-batch (sorted by objective): a forward pass on *detached* parameters -- autograd then skips
   the ordinary weight gradients -- and one backward pass of Σ_t sum_t, during which
   :class:`~mtft.gradients.PerObjectiveGradients` accumulates every objective's gradient.
2. Reduce the per-objective gradients and all-reduce the counts; divide by the global counts: g_t = ∇L_t exactly,
   for the whole optimizer step (all micro-batches, all ranks). On several ranks the gradients are sharded
   (:class:`~mtft.gradients.ShardedGradients`): during the backward pass each layer's per-objective gradients
   are reduce-scattered as soon as they are written, so a rank holds 1/N of every g_t and never all T × P; each
   rank forms the partial Gram on its shard, the T × T partials are all-reduced, and the combination of step 4
   is formed on the shards, each rank handing the engine its part (× N, zeros elsewhere) for the engine's own
   gradient averaging to complete -- the same Gram and gradient, identical on every rank, for T × P floats
   reduce-scattered + T² of traffic beyond a plain step's instead of an all-reduce of T × P.
3. Gram of the shared parameters → weights w (objectives absent from the step are dropped).
4. Write the update: one backward pass of the surrogate Σ_θ ⟨θ, Σ_t w_t g_t^θ⟩, whose gradient is exactly the
   gradient of Σ_t w_t L_t. It goes through ``engine.backward`` so DeepSpeed's gradient hooks, reduction and
   clipping run as usual, then ``engine.step()``. Every rank's gradient is averaged over the ranks by the engine
   (DeepSpeed's all-reduce under ZeRO-0/1, its reduce-scatter into the optimizer's or the parameters' partitions
   under ZeRO-2/3): unsharded, the combined gradient is the same on every rank and averages to itself (to the
   round-off of summing N copies); sharded, each rank hands N × its own part and zeros elsewhere
   (:meth:`~mtft.gradients.ShardedGradients.contribution`), which averages to the combined gradient -- bit for bit
   when N is a power of two, to round-off otherwise.

Under ZeRO-3 a parameter's ``data`` is an empty placeholder outside its module's forward and backward. Step 1 then
runs the module itself with the trainable parameters' ``requires_grad`` off for the forward pass (the same effect
as the detached call: no ordinary weight gradient), so that DeepSpeed's module hooks gather each layer's
parameters for its forward and backward and release them after, layer by layer; the per-objective products never
read a parameter's values, only its shape (``ds_shape``). With activation checkpointing step 1 runs on the whole
model instead, every parameter gathered and DeepSpeed's module hooks lifted (:meth:`GramWeightedStep._unpartitioned`).
Step 4 gathers the trainable parameters whole (``deepspeed.zero.GatheredParameters``) for the surrogate's backward
pass -- DeepSpeed's ZeRO-3 gradient hooks reduce-scatter the full-shape gradients into each rank's partition as they
do in an ordinary backward pass -- and releases them before ``engine.step()``, which updates the partitions. So
during step 4 every rank holds the full trainable parameters and a full-shape gradient to hand the engine (the
combination, or this rank's contribution to it), 2 P floats, beside the sharded T × P/N per-objective buffers.

Without per-objective buffers (``weighting.gradient_buffers: none``, :mod:`mtft.gradients.layerwise`) step 1's
backward pass records a tape instead, from which steps 2-4 form the Gram and the update layer by layer; with
``weighting.bufferless_update: backward`` (one process, one micro-batch a step) it keeps its graph and forms the Gram
as it goes, and step 4's update comes from a second backward pass of Σ_t (w_t / count_t) sum_t over that graph.

A Gram that holds NaN or inf is refused by the solver: the step is skipped on every rank alike, and logged.

Two options (``weighting.metric``, ``weighting.descent_check``):

- ``metric``: an :class:`~mtft.training.adamw_preconditioner.AdamWPreconditioner` forms the Gram in the
  optimizer's metric, G_ts = g_tᵀ P g_s with P = diag(1/(√v̂+ε)) AdamW's preconditioner (the Euclidean Gram
  before the first step and with SGD). The combined gradient Σ_t w_t g_t is unchanged: AdamW applies P to it
  itself. ZeRO stages 0-2 only (refused under ZeRO-3: :func:`mtft.training.engine.deepspeed_config`).
- ``descent_check``: after ``engine.step()``, the first-order change of every objective's loss under the update
  actually applied, g_tᵀΔθ with Δθ = θ_{k+1} − θ_k over every trainable parameter (T dot products), and whether
  all of them are negative. The same step then also serves weightings that read no Gram (none is formed). Under
  ZeRO-3 θ_k and θ_{k+1} are gathered whole for it (a full copy of the trainable parameters held over the step).
"""

from __future__ import annotations

import contextlib
import time
from typing import Iterator, Optional

import numpy as np
import torch

from mtft.core.distributed import all_reduce_sum
from mtft.core.errors import Diverged
from mtft.gradients import LayerwiseGradients, PerObjectiveGradients, ShardedGradients
from mtft.models.checkpointing import recomputed_modules
from mtft.pareto import SolverInputError
from mtft.reporting.logs import logger
from mtft.training.adamw_preconditioner import AdamWPreconditioner
from mtft.training.step import StepResult, drain_regularisers
from mtft.weighting import Weighting


class GramWeightedStep:
    def __init__(
        self,
        engine,
        weighting: Weighting,
        num_objectives: int,
        world_size: int,
        shared: Optional[list[torch.nn.Parameter]],
        cosine_every: int = 0,
        shared_rows: Optional[dict[torch.nn.Parameter, torch.Tensor]] = None,
        metric: Optional[AdamWPreconditioner] = None,
        descent_check: bool = False,
        shard_gradients: bool = True,
        buffer_dtype: Optional[torch.dtype] = None,
        bufferless: bool = False,
        chunk_bytes: Optional[int] = None,
        second_backward: bool = False,
    ):
        """``shared``: the parameters of the Gram (None for a weighting that reads none); ``metric``: form the
        Gram in the optimizer's metric; ``descent_check``: measure g_tᵀΔθ of the applied update;
        ``shard_gradients``: on several ranks, reduce-scatter the per-objective gradients (the default) rather
        than all-reduce them whole (kept to measure the two against each other: bench/sharded_gram.py);
        ``buffer_dtype``: of the per-objective gradient buffers (None: the parameters', float32 at least);
        ``bufferless``: no T × P buffers -- the Gram and the update formed layer by layer from a tape of the backward
        pass (:mod:`mtft.gradients.layerwise`; ``weighting.gradient_buffers: none``); ``chunk_bytes``: the most one
        layer's products may hold at once there (None: :class:`~mtft.gradients.LayerwiseGradients`' default);
        ``second_backward``: bufferless with no tape -- the Gram formed during the backward pass, the update by a second
        backward pass of the weighted losses (``weighting.bufferless_update: backward``; one process, one micro-batch a
        step, no descent check)."""
        if second_backward and not bufferless:
            raise ValueError("second_backward is a way of the bufferless step (bufferless=True)")
        if second_backward and (descent_check or world_size > 1):
            raise ValueError(
                "weighting.bufferless_update=backward keeps no tape: it cannot re-form the products for "
                "weighting.descent_check, nor sum several processes' products before the Gram; use "
                "weighting.bufferless_update=tape"
            )
        self.engine = engine
        self.weighting = weighting
        self.num_objectives = num_objectives
        self.world_size = world_size
        self.module = engine.module
        sharding = world_size > 1 and shard_gradients and not bufferless
        self.collector = PerObjectiveGradients(
            self.module, num_objectives, dtype=buffer_dtype, dense_in_buffer=not (sharding or bufferless)
        ).attach()
        rank = torch.distributed.get_rank() if world_size > 1 else 0
        self.sharded = ShardedGradients(self.collector, rank, world_size) if sharding else None
        self.layerwise = LayerwiseGradients(self.collector, rank, world_size, chunk_bytes) if bufferless else None
        self.second_backward = second_backward
        self.shared = shared
        self.shared_rows = shared_rows
        self.cosine_every = cosine_every
        self.metric = metric
        self.descent_check = descent_check
        self.trainable = [p for p in self.module.parameters() if p.requires_grad]
        # activation checkpointing: the layers recomputed in the backward pass hand their inputs over then
        self.collector.recomputed = recomputed_modules(self.module)
        # ZeRO-3: DeepSpeed gives its partitioned parameters a ds_id (what its is_zero_param tests)
        self.partitioned = any(hasattr(p, "ds_id") for p in self.trainable)
        if self.partitioned:
            whole = sum(bool(getattr(p, "ds_persist", False)) for p in self.trainable)
            passes = (
                "the per-objective passes gather every parameter (activation checkpointing)"
                if self.collector.recomputed
                else "the per-objective passes gather one layer at a time"
            )
            logger.info(
                f"{weighting.name} under ZeRO-3: {len(self.trainable) - whole} of {len(self.trainable)} trainable "
                f"tensors partitioned ({whole} under DeepSpeed's persistence threshold, held whole); {passes}, the "
                "update all of them"
            )
        self.steps = 0

    def __call__(self, micro_batches) -> StepResult:
        start = time.perf_counter()
        self.collector.zero()
        if self.sharded is not None:
            self.sharded.zero()
        if self.layerwise is not None:
            self.layerwise.zero()
        extras: dict[str, float] = {}
        diagonal = None
        if self.weighting.needs_gram and self.metric is not None:
            diagonal = self.metric.diagonal(self.shared)  # the optimizer's state before this step's update
            extras["metric_preconditioned"] = float(diagonal is not None)
        if self.second_backward:
            self.layerwise.form_during_backward(self.shared or [], self.shared_rows, diagonal)
        sums = torch.zeros(self.num_objectives, dtype=torch.float64)
        counts = torch.zeros(self.num_objectives, dtype=torch.float64)
        examples = 0
        graph = None  # second_backward: the micro-batch's loss sums, their graph kept for the update
        for batch in micro_batches:
            if graph is not None:
                raise ValueError(
                    "weighting.bufferless_update=backward forms the Gram during the backward pass, exact for one "
                    "micro-batch a step; set training.gradient_accumulation_steps=1 or weighting.bufferless_update=tape"
                )
            order = torch.argsort(batch["objective_index"], stable=True)  # contiguous rows per objective
            batch = {k: v[order].to(self.engine.device) for k, v in batch.items()}
            with self._per_objective_pass():
                with self.collector.capturing():
                    batch_sums, batch_counts = self._forward(batch)
                with self.collector.replaying():
                    if self.sharded is not None:  # each layer's gradients reduce-scattered as the pass completes it
                        self.sharded.backward(batch_sums.sum(), batch_counts)
                    else:
                        batch_sums.sum().backward(retain_graph=self.second_backward)
            if self.second_backward:
                graph = batch_sums
            sums += batch_sums.detach().double().cpu()
            counts += batch_counts.detach().double().cpu()
            examples += batch["input_ids"].shape[0] * self.world_size
        backward_seconds = time.perf_counter() - start

        counts, sums = all_reduce_sum(counts), all_reduce_sum(sums)
        present = counts > 0
        gradients = self._reduced()
        # The buffers hold gradients of the loss *sums*; g_t = that / count_t. The scale is folded into the
        # Gram (D G D) and the combination weights instead of a pass over the T × P buffers.
        scale = torch.where(present, 1.0 / counts.clamp(min=1), 0.0)
        losses = torch.where(present, sums / counts.clamp(min=1), torch.nan)
        extras.update({"backward_s": backward_seconds, **drain_regularisers(self.module)})
        if self.sharded is not None:  # the ranks the per-objective gradients were sharded over
            extras["gram_shards"] = float(self.world_size)
        gram, sub = None, None
        if self.weighting.needs_gram:
            assert self.shared is not None
            gram_start = time.perf_counter()
            gram = gradients.gram(self.shared, self.shared_rows, diagonal) * scale[:, None] * scale[None, :]
            extras["gram_s"] = time.perf_counter() - gram_start
            sub = gram[present][:, present].numpy()

        weights = torch.zeros(self.num_objectives, dtype=torch.float64)
        try:
            solve_start = time.perf_counter()
            w = self.weighting(losses[present].numpy(), sub)
            extras["weighting_s"] = time.perf_counter() - solve_start
        except SolverInputError as error:  # a NaN/inf Gram: skip the step on every rank alike
            self.steps += 1
            return StepResult(losses, counts, weights, float("nan"), examples, extras, skipped=str(error))
        w = np.asarray(w, dtype=np.float64)
        if not np.isfinite(w).all():  # applied, it would turn every trainable weight into NaN
            raise Diverged(
                f"weighting {self.weighting.name} returned non-finite weights at step {self.steps + 1} "
                f"({np.array2string(w, precision=3, threshold=8)}); the update was not applied"
            )
        weights[present] = torch.as_tensor(w)
        # what the engine's own averaging over the ranks turns into Σ_t w_t g_t (sharded: N x this rank's part,
        # zeros elsewhere -- no all-gather; bit-exact for N a power of two, round-off otherwise)
        update_start = time.perf_counter()
        if graph is not None:
            self._backward_of_weighted_losses(graph, weights * scale)
            del graph
        combined = gradients.contribution(weights * scale)
        extras["combine_s"] = time.perf_counter() - update_start
        before = None
        with self._gathered():
            if self.descent_check:
                before = {p: p.detach().clone() for p in self.collector.names}
            surrogate = sum((p * combined[p].to(p.dtype)).sum() for p in combined)
            self.engine.backward(surrogate)
        del combined
        if self.layerwise is not None and before is None:
            self.layerwise.zero()  # the tape's last use (the descent check reads it after the step)
        optimizer_start = time.perf_counter()
        self.engine.step()
        extras["optimizer_s"] = time.perf_counter() - optimizer_start
        self.steps += 1
        extras.update(self.weighting.state())
        first_order, cosines = None, None
        if before is not None:
            with self._gathered():
                first_order = gradients.dot({p: p.detach() - value for p, value in before.items()}) * scale
            first_order[~present] = torch.nan
            extras.update(_descent_summary(first_order[present]))
        if self.layerwise is not None:
            self.layerwise.zero()
        if sub is not None and gram is not None:
            extras.update(_gram_summary(sub, np.asarray(w, dtype=np.float64)))
            if self.cosine_every and self.steps % self.cosine_every == 0:
                cosines = _cosines(gram.numpy(), present.numpy())
        extras["step_s"] = time.perf_counter() - start
        loss = float((weights[present] * losses[present]).sum())
        return StepResult(
            losses, counts, weights, loss, examples, extras, first_order, weighting_row=True, cosines=cosines
        )

    def _backward_of_weighted_losses(self, graph: torch.Tensor, scaled: torch.Tensor) -> None:
        """The second backward pass of ``bufferless_update: backward``: of Σ_t a_t sum_t over the kept graph (a_t =
        w_t / count_t), whose output gradients the layers' hooks turn into the update (and which frees the graph)."""
        assert self.layerwise is not None
        with self._per_objective_pass(), self.layerwise.combining(), self.collector.replaying():
            (graph * scaled.to(graph.device, graph.dtype)).sum().backward()

    def _reduced(self) -> PerObjectiveGradients | ShardedGradients | LayerwiseGradients:
        """After the step's backward passes: the per-objective gradients of the global batch, ready to read."""
        if self.layerwise is not None:  # reduced layer by layer as they are read
            return self.layerwise
        self.collector.finalize()
        if self.world_size > 1:
            self.collector.reduce_row_sparse()
        if self.sharded is not None:
            return self.sharded
        if self.world_size > 1:
            torch.distributed.all_reduce(self.collector.flat)
        return self.collector

    def _forward(self, batch: dict[str, torch.Tensor]):
        """The model's per-objective loss sums and counts, with no ordinary weight gradient in the graph: on
        detached parameters; under ZeRO-3 (whose module hooks gather and release each layer's parameters, which a
        call on other tensors would bypass) with the trainable parameters' ``requires_grad`` off for the pass; with
        activation checkpointing on the module itself, inside :meth:`_per_objective_pass`."""
        if self.collector.recomputed:
            return self.module(**batch)
        if not self.partitioned:
            detached = {name: p.detach() for name, p in self.module.named_parameters()}
            return torch.func.functional_call(self.module, detached, args=(), kwargs=batch)
        with self._frozen():
            return self.module(**batch)

    @contextlib.contextmanager
    def _per_objective_pass(self) -> Iterator[None]:
        """Around a micro-batch's forward and backward passes. With activation checkpointing the trainable
        parameters' ``requires_grad`` is off through both, since the recomputation in the backward pass must save
        exactly the tensors the first pass saved (torch checks), and every layer is recomputed whole (no early
        stop), so that each recomputed layer hands its input over."""
        if not self.collector.recomputed:
            yield
            return
        with self._unpartitioned(), self._frozen(), torch.utils.checkpoint.set_checkpoint_early_stop(False):
            yield

    @contextlib.contextmanager
    def _unpartitioned(self) -> Iterator[None]:
        """Under ZeRO-3 with activation checkpointing: the whole model, every parameter gathered and DeepSpeed's
        module hooks lifted for the pass (DeepSpeed's own ``unwrap_model_for_generation``, hooks put back after).
        With the hooks, a recomputed layer's forward ends by releasing its parameters, and the parameters that do not
        require a gradient -- all of them in this pass, and the frozen base weights of an adapter -- are the very
        tensors torch's checkpoint keeps for that layer's backward pass (by reference, not as detached copies):
        released, they are empty there. Gathered, the pass holds every parameter whole, as the update (step 4)
        holds the trainable ones; otherwise nothing to do."""
        if not self.partitioned:
            yield
            return
        from deepspeed.runtime.zero.stage3 import unwrap_model_for_generation

        with unwrap_model_for_generation(self.engine):
            yield

    @contextlib.contextmanager
    def _frozen(self) -> Iterator[None]:
        try:
            for p in self.trainable:
                p.requires_grad_(False)
            yield
        finally:
            for p in self.trainable:
                p.requires_grad_(True)

    @contextlib.contextmanager
    def _gathered(self) -> Iterator[None]:
        """Under ZeRO-3, the trainable parameters whole on every rank (released on exit, unchanged: every rank
        gathers the same values, ``modifier_rank=None``); otherwise nothing to do."""
        if not self.partitioned:
            yield
            return
        import deepspeed

        with deepspeed.zero.GatheredParameters(self.trainable, modifier_rank=None):
            yield


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
