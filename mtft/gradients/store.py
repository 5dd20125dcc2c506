"""Where a Gram step keeps its per-objective gradients: one interface, four stores.

A Gram-based step (:class:`mtft.training.gram_step.GramWeightedStep`) asks the same of every store: start a step
(:meth:`GradientStore.zero`), run each micro-batch's per-objective forward and backward pass into it
(:meth:`~GradientStore.backward`), reduce it over the micro-batches and the ranks (:meth:`~GradientStore.reduce`),
form the Gram of the shared parameters (:meth:`~GradientStore.gram`), hand the engine the combination for given
weights (:meth:`~GradientStore.contribution`, then :meth:`~GradientStore.write`) and, for the descent check, the dot
products with the update applied (:meth:`~GradientStore.first_order`) -- as TorchJD's autogram ``Engine`` hides its
own (Quinton & Rey, 2024). Which store a run uses is decided once, by :func:`mtft.training.gradient_store
.gradient_store`:

* :class:`DenseStore` -- T × P buffers (:class:`~mtft.gradients.PerObjectiveGradients`), all-reduced whole on
  several ranks (``gradients.buffers: full`` or ``bfloat16``, one process);
* :class:`ShardedStore` -- the same buffers reduce-scattered layer by layer during the backward pass, so each rank
  holds 1/N of them (:class:`~mtft.gradients.ShardedGradients`; several processes);
* :class:`TapeStore` -- no buffers: a tape of the backward pass, from which the Gram, the combination and the dot
  products are formed layer by layer (:class:`~mtft.gradients.LayerwiseGradients`; ``gradients.buffers: none``);
* :class:`SecondBackwardStore` -- no tape either: the Gram formed during the backward pass, the combination by a
  second backward pass of the weighted losses (``gradients.update: backward``; the rule of where it runs is
  :func:`mtft.config.bufferless.second_backward_refusal`).

:class:`ModelPass` is how every store runs the model: the forward pass on detached parameters (autograd then skips
the ordinary weight gradients), and under ZeRO-3 or activation checkpointing what those need.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from typing import Any, Iterator, Optional

import torch
from torch import nn

from mtft.gradients.layerwise import LayerwiseGradients
from mtft.gradients.per_objective import Metric, OnlyRows, PerObjectiveGradients
from mtft.gradients.sharded import ShardedGradients

Batch = dict[str, torch.Tensor]


class ModelPass:
    """The per-objective passes over ``engine.module`` (a DeepSpeed engine, or one that acts like it).

    Under ZeRO-3 a parameter's ``data`` is an empty placeholder outside its module's forward and backward: the
    forward pass then runs the module itself with the trainable parameters' ``requires_grad`` off (the same effect
    as the detached call: no ordinary weight gradient), so that DeepSpeed's module hooks gather each layer's
    parameters for its forward and backward and release them after, layer by layer; the per-objective products
    read a parameter's shape only (``ds_shape``). With activation checkpointing (``recomputed``: the modules whose
    forward runs again in the backward pass) it runs on the whole model, every parameter gathered and DeepSpeed's
    module hooks lifted (:meth:`_unpartitioned`). The update (:meth:`GradientStore.write`) gathers the trainable
    parameters whole (:meth:`gathered`)."""

    def __init__(self, engine: Any, recomputed: Optional[set[nn.Module]] = None, rank: int = 0, world_size: int = 1):
        self.engine = engine
        self.rank, self.world_size = rank, world_size
        self.module: nn.Module = engine.module
        self.trainable = [p for p in self.module.parameters() if p.requires_grad]
        self.recomputed = recomputed or set()
        # ZeRO-3: DeepSpeed gives its partitioned parameters a ds_id (what its is_zero_param tests)
        self.partitioned = any(hasattr(p, "ds_id") for p in self.trainable)

    def partitioning(self) -> str:
        """Under ZeRO-3, what is partitioned and what the passes gather (for the log)."""
        whole = sum(bool(getattr(p, "ds_persist", False)) for p in self.trainable)
        passes = (
            "the per-objective passes gather every parameter (activation checkpointing)"
            if self.recomputed
            else "the per-objective passes gather one layer at a time"
        )
        return (
            f"{len(self.trainable) - whole} of {len(self.trainable)} trainable tensors partitioned ({whole} under "
            f"DeepSpeed's persistence threshold, held whole); {passes}, the update all of them"
        )

    def on_device(self, batch: Batch) -> Batch:
        """The micro-batch on the engine's device, its rows sorted by objective (each objective's rows contiguous)."""
        order = torch.argsort(batch["objective_index"], stable=True)
        return {k: v[order].to(self.engine.device) for k, v in batch.items()}

    def forward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's per-objective loss sums and counts, with no ordinary weight gradient in the graph: on
        detached parameters; under ZeRO-3 (whose module hooks gather and release each layer's parameters, which a
        call on other tensors would bypass) with the trainable parameters' ``requires_grad`` off for the pass; with
        activation checkpointing on the module itself, inside :meth:`around`."""
        if self.recomputed:
            return self.module(**batch)
        if not self.partitioned:
            detached = {name: p.detach() for name, p in self.module.named_parameters()}
            return torch.func.functional_call(self.module, detached, args=(), kwargs=batch)
        with self._frozen():
            return self.module(**batch)

    @contextlib.contextmanager
    def around(self) -> Iterator[None]:
        """Around a micro-batch's forward and backward passes. With activation checkpointing the trainable
        parameters' ``requires_grad`` is off through both, since the recomputation in the backward pass must save
        exactly the tensors the first pass saved (torch checks), and every layer is recomputed whole (no early
        stop), so that each recomputed layer hands its input over."""
        if not self.recomputed:
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
        released, they are empty there. Gathered, the pass holds every parameter whole, as the update holds the
        trainable ones; otherwise nothing to do."""
        if not self.partitioned:
            yield
            return
        from deepspeed.runtime.zero.stage3 import unwrap_model_for_generation  # type: ignore[import-untyped]

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
    def gathered(self) -> Iterator[None]:
        """Under ZeRO-3, the trainable parameters whole on every rank (released on exit, unchanged: every rank
        gathers the same values, ``modifier_rank=None``); otherwise nothing to do."""
        if not self.partitioned:
            yield
            return
        import deepspeed  # type: ignore[import-untyped]

        with deepspeed.zero.GatheredParameters(self.trainable, modifier_rank=None):
            yield


class GradientStore(ABC):
    """Every objective's gradient of one optimizer step's loss *sums* (the step folds the 1/count_t scales into the
    Gram and the weights), behind the operations the Gram step needs. ``shared``, ``shared_rows``: the parameters of
    the Gram and the rows of row-sparse ones it reads (None: a step that forms no Gram, e.g. the descent check's);
    ``dtype``: of the buffers (None: the parameters', float32 at least). The Gram, the contribution and the dot
    products are those of ``gradients`` (the collector itself, or the sharded or layerwise gradients over it)."""

    #: the ranks the gradients are sharded over (1: every rank holds them whole)
    shards = 1
    gradients: PerObjectiveGradients | ShardedGradients | LayerwiseGradients

    #: whether dense parameters' gradients live in the T × P buffer (False: the store keeps them otherwise)
    dense_in_buffer = True

    def __init__(
        self,
        model: ModelPass,
        num_objectives: int,
        shared: Optional[list[nn.Parameter]] = None,
        shared_rows: OnlyRows = None,
        dtype: Optional[torch.dtype] = None,
    ):
        self.model, self.world_size = model, model.world_size
        self.collector = PerObjectiveGradients(model.module, num_objectives, dtype, self.dense_in_buffer).attach()
        self.num_objectives = num_objectives
        self.shared, self.shared_rows = shared, shared_rows
        self.metric: Metric = None
        # activation checkpointing: the layers recomputed in the backward pass hand their inputs over then
        self.collector.recomputed = model.recomputed
        self.gradients = self._gradients()

    def _gradients(self) -> PerObjectiveGradients | ShardedGradients | LayerwiseGradients:
        """What the Gram, the contribution and the dot products are read from: the collector's buffers here."""
        return self.collector

    def zero(self, metric: Metric = None) -> None:
        """Start a step whose Gram is formed in the diagonal ``metric`` (None: the Euclidean Gram)."""
        self.metric = metric
        self.collector.zero()

    def backward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """One micro-batch's per-objective forward pass and the backward pass of Σ_t sum_t, which writes every
        objective's gradient into the store; returns its per-objective loss sums and counts (on this rank)."""
        batch = self.model.on_device(batch)
        with self.model.around():
            with self.collector.capturing():
                sums, counts = self.model.forward(batch)
            with self.collector.replaying():
                self._backward(sums, counts)
        return sums, counts

    def _backward(self, sums: torch.Tensor, counts: torch.Tensor) -> None:
        """The backward pass of Σ_t sums_t; ``counts``: this rank's examples of each objective in the micro-batch."""
        sums.sum().backward()

    @abstractmethod
    def reduce(self) -> None:
        """After the step's micro-batches: the gradients of the global batch, ready to read."""

    def gram(self) -> torch.Tensor:
        """G_ts = g_tᵀ g_s (g_tᵀ P g_s in the metric) over the shared parameters, float64, identical on every rank."""
        assert self.shared is not None, "a store built without the Gram's parameters forms no Gram"
        return self.gradients.gram(self.shared, self.shared_rows, self.metric)

    def contribution(self, weights: torch.Tensor) -> dict[torch.Tensor, torch.Tensor]:
        """What this rank hands the engine, whose averaging over the ranks makes it Σ_t weights_t g_t (``weights``
        may fold in 1/count_t), for every trainable parameter."""
        return self.gradients.contribution(weights)

    def dot(self, vectors: dict[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """(g_tᵀ v)_t in float64 for a vector given per parameter, summed over the ranks."""
        return self.gradients.dot(vectors)

    @abstractmethod
    def release(self) -> None:
        """The step no longer reads the store: what it holds beyond its buffers is freed."""

    def write(self, combined: dict[torch.Tensor, torch.Tensor], keep: bool = False) -> Optional[dict]:
        """``engine.backward`` of the surrogate Σ_θ ⟨θ, combined_θ⟩, whose gradient is ``combined``: DeepSpeed's
        gradient hooks, reduction and clipping run as in a plain step (under ZeRO-3 on the trainable parameters
        gathered whole, whose full-shape gradients its hooks reduce-scatter into each rank's partition). ``keep``:
        return a copy of the trainable parameters before the update, for :meth:`first_order`."""
        with self.model.gathered():
            before = {p: p.detach().clone() for p in self.collector.names} if keep else None
            surrogate = sum((p * combined[p].to(p.dtype)).sum() for p in combined)
            self.model.engine.backward(surrogate)
        return before

    def first_order(self, before: dict[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """g_tᵀΔθ of the update applied since ``before`` (:meth:`write`), Δθ over every trainable parameter."""
        with self.model.gathered():
            return self.dot({p: p.detach() - value for p, value in before.items()})


class DenseStore(GradientStore):
    """T × P buffers (row-sparse weights by touched row), all-reduced whole on several ranks (``shard=False`` of
    :func:`mtft.training.gradient_store.gradient_store`, kept to measure against the sharded store)."""

    def reduce(self) -> None:
        self.collector.finalize()
        if self.world_size > 1:
            self.collector.reduce_row_sparse()
            torch.distributed.all_reduce(self.collector.flat)

    def release(self) -> None:
        """Nothing: the buffers are kept for the next step."""


class ShardedStore(GradientStore):
    """This rank's 1/N of every objective's reduced gradient, reduce-scattered layer by layer during the backward
    pass (:class:`~mtft.gradients.ShardedGradients`)."""

    dense_in_buffer = False

    @property
    def shards(self) -> int:  # type: ignore[override]
        return self.model.world_size

    def _gradients(self) -> ShardedGradients:
        self.sharded = ShardedGradients(self.collector, self.model.rank, self.model.world_size)
        return self.sharded

    def zero(self, metric: Metric = None) -> None:
        super().zero(metric)
        self.sharded.zero()

    def _backward(self, sums: torch.Tensor, counts: torch.Tensor) -> None:
        self.sharded.backward(sums.sum(), counts)  # each layer's gradients reduce-scattered as the pass completes it

    def reduce(self) -> None:
        self.collector.finalize()
        self.collector.reduce_row_sparse()

    def release(self) -> None:
        """Nothing: the shard is kept for the next step."""


class TapeStore(GradientStore):
    """No T × P buffers: each trainable layer's input and output gradient on a tape, from which the Gram, the
    combination and the dot products are formed layer by layer (:mod:`mtft.gradients.layerwise`). ``chunk_bytes``:
    the most one layer's products may hold at once (None: :class:`~mtft.gradients.LayerwiseGradients`' default)."""

    dense_in_buffer = False

    def __init__(self, *args: Any, chunk_bytes: Optional[int] = None, **kwargs: Any):
        self.chunk_bytes = chunk_bytes
        super().__init__(*args, **kwargs)

    def _gradients(self) -> LayerwiseGradients:
        self.layerwise = LayerwiseGradients(self.collector, self.model.rank, self.model.world_size, self.chunk_bytes)
        return self.layerwise

    def zero(self, metric: Metric = None) -> None:
        super().zero(metric)
        self.layerwise.zero()

    def reduce(self) -> None:
        """Nothing: the layers' products are reduced over the ranks as they are formed."""

    def release(self) -> None:
        self.layerwise.zero()  # the tape's tensors are freed


class SecondBackwardStore(TapeStore):
    """No tape: the first backward pass keeps its graph and forms the Gram layer by layer as it goes; the update
    comes from a second backward pass of Σ_t a_t sum_t over that graph (a_t = w_t / count_t), whose output gradients
    the layers' hooks turn into the combination (:meth:`LayerwiseGradients.form_during_backward`). Where it may run
    (one process, one micro-batch a step, no descent check, not ZeRO-3) is
    :func:`mtft.config.bufferless.second_backward_refusal`'s, checked by the store's factory."""

    graph: Optional[torch.Tensor] = None  # the micro-batch's loss sums, their graph kept for the update

    def zero(self, metric: Metric = None) -> None:
        super().zero(metric)
        self.graph = None
        self.layerwise.form_during_backward(self.shared or [], self.shared_rows, metric)

    def backward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        if self.graph is not None:
            raise RuntimeError("the second backward pass takes one micro-batch a step (second_backward_refusal)")
        return super().backward(batch)

    def _backward(self, sums: torch.Tensor, counts: torch.Tensor) -> None:
        sums.sum().backward(retain_graph=True)
        self.graph = sums

    def contribution(self, weights: torch.Tensor) -> dict[torch.Tensor, torch.Tensor]:
        """The second backward pass, of Σ_t weights_t sum_t over the kept graph (which it frees): each layer's
        output gradient arrives scaled, and its product with the layer's input is the layer's combination."""
        graph, self.graph = self.graph, None
        assert graph is not None, "contribution() follows a micro-batch's backward()"
        with self.model.around(), self.layerwise.combining(), self.collector.replaying():
            (graph * weights.to(graph.device, graph.dtype)).sum().backward()
        del graph
        return self.layerwise.contribution(weights)

    def release(self) -> None:
        self.graph = None
        super().release()
