"""The one place a Gram step's gradient store is chosen (:mod:`mtft.gradients.store`), and every rule of which
store may run where checked.

``buffers`` is ``gradients.buffers`` once ``auto`` is resolved (:mod:`mtft.training.buffers`): ``full`` or
``bfloat16`` keep T × P buffers -- whole on one process (:class:`~mtft.gradients.store.DenseStore`), sharded over
several (:class:`~mtft.gradients.store.ShardedStore`) --, ``none`` keeps none: a tape of the backward pass
(:class:`~mtft.gradients.store.TapeStore`, ``update="tape"``) or the Gram formed during the backward pass and the
update by a second one (:class:`~mtft.gradients.store.SecondBackwardStore`, ``update="backward"``), which
:func:`mtft.config.bufferless.second_backward_refusal` admits where it is exact.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

import torch
from torch import nn

from mtft.config.bufferless import second_backward_refusal
from mtft.core.errors import ConfigError
from mtft.gradients.per_objective import OnlyRows
from mtft.gradients.store import DenseStore, GradientStore, ModelPass, SecondBackwardStore, ShardedStore, TapeStore
from mtft.models.checkpointing import recomputed_modules


def gradient_store(
    engine: Any,
    num_objectives: int,
    world_size: int,
    shared: Optional[list[nn.Parameter]] = None,
    shared_rows: OnlyRows = None,
    *,
    buffers: Literal["full", "bfloat16", "none"] = "full",
    update: Literal["tape", "backward"] = "tape",
    chunk_bytes: Optional[int] = None,
    shard: bool = True,
    micro_batches: int = 1,
    descent_check: bool = False,
) -> GradientStore:
    """The store of ``num_objectives`` objectives' gradients of ``engine.module``'s trainable parameters, for a step
    of ``micro_batches`` on ``world_size`` processes; ``shared``, ``shared_rows``: the Gram's parameters and the rows
    of its row-sparse ones (None: no Gram). ``chunk_bytes``: the most a bufferless layer's products may hold at once
    (``gradients.chunk_mb``); ``shard``: on several processes, reduce-scatter the buffers (the default)
    rather than all-reduce them whole (kept to measure the two: bench/sharded_gram.py); ``descent_check``: the step
    measures g_tᵀΔθ, so the store must re-form its products after the update."""
    rank = torch.distributed.get_rank() if world_size > 1 else 0
    model = ModelPass(engine, recomputed_modules(engine.module), rank, world_size)
    if buffers == "none" and update == "backward":
        refusal = second_backward_refusal(micro_batches, descent_check, world_size, model.partitioned)
        if refusal is not None:
            raise ConfigError(refusal)
        return SecondBackwardStore(model, num_objectives, shared, shared_rows, chunk_bytes=chunk_bytes)
    if buffers == "none":
        return TapeStore(model, num_objectives, shared, shared_rows, chunk_bytes=chunk_bytes)
    dtype = torch.bfloat16 if buffers == "bfloat16" else None
    if world_size > 1 and shard:
        return ShardedStore(model, num_objectives, shared, shared_rows, dtype)
    return DenseStore(model, num_objectives, shared, shared_rows, dtype)
