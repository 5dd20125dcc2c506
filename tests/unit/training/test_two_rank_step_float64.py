"""Issue 38, item 6 (docs/lfmlf.md, "Two processes against one"): the LF-MLF step of two gloo ranks, each holding
half of the global batch (sharded per-objective gradients, the engine's average of the ranks' contributions, with
and without the ZeRO-3 path), against one process holding all of it, in float64 on the tiny Multi-LoRA model. The
two paths share no count, mask or shard difference: the Gram, the weights, ||d||² and the update agree to float64
round-off (~1e-15), so the float32 gap between a two-process ZeRO-3 and a one-process ZeRO-2 run is summation
order, amplified by the min-norm weights' sensitivity to the Gram (tests/unit/pareto/test_weight_sensitivity.py)."""

from __future__ import annotations

import contextlib
import copy
import os

import deepspeed
import numpy as np
import pytest
import torch

from mtft.training.gradient_store import gradient_store
from mtft.training.gram_step import GramWeightedStep
from mtft.weighting.lfmlf import LFMLF
from tests.helpers.gradients import MIXED, FakeEngine, make_batch
from tests.helpers.gradients import TEXTS as GRADIENT_TEXTS
from tests.helpers.launch import free_port, run_ranks
from tests.helpers.layerwise import multi_lora
from tests.helpers.sharded import as_partitioned

WORLD = 2
# the global batch: 8 rows of 3 objectives over two tasks; rank r holds rows 4r..4r+3, padded to its own longest
# row (as each rank's collation pads), so the two ranks see different padding from the one process
ROWS = MIXED
TEXTS = [*GRADIENT_TEXTS[:5], "delta", "gamma alpha beta epsilon", "theta eta"]  # rank 1: other lengths


class SeenLFMLF(LFMLF):
    """LF-MLF that keeps the Gram it was given."""

    def weigh(self, losses, gram):
        self.seen = np.array(gram, copy=True)
        return super().weigh(losses, gram)


class AveragingEngine(FakeEngine):
    """The engine's averaging of every gradient over the ranks (DeepSpeed's all-reduce or reduce-scatter)."""

    def backward(self, loss):
        loss.backward()
        for p in self.module.parameters():
            if p.grad is not None:
                torch.distributed.all_reduce(p.grad)
                p.grad /= WORLD


def half(tok, rank: int) -> dict[str, torch.Tensor]:
    rows = slice(4 * rank, 4 * rank + 4)
    return make_batch(tok, **{k: v[rows] for k, v in ROWS.items()}, texts=TEXTS[rows])


def one_step(model, engine, world: int, batch) -> tuple:
    params = [p for p in model.parameters() if p.requires_grad]
    weighting = SeenLFMLF()
    step = GramWeightedStep(gradient_store(engine, 3, world, params), weighting)
    result = step([batch])
    return weighting.seen, result, [p.grad.clone() for p in params], step


def _worker(rank: int, port: int, model, tok, expected) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        for zero3 in (False, True):
            twin = copy.deepcopy(model)
            with _zero3_stand_in(twin) if zero3 else contextlib.nullcontext():
                gram, result, grads, step = one_step(twin, AveragingEngine(twin), WORLD, half(tok, rank))
            assert step.store.shards == WORLD and step.store.model.partitioned == zero3
            _check(gram, result, grads, expected)
    finally:
        torch.distributed.destroy_process_group()


@contextlib.contextmanager
def _zero3_stand_in(model):
    """The step's ZeRO-3 path (a forward pass with requires_grad off, the surrogate inside a gather) on parameters
    marked as DeepSpeed marks them; their data stays in place (the gathering itself is DeepSpeed's)."""
    data = as_partitioned(model)
    for p, value in data.items():
        p.data = value
    original = deepspeed.zero.GatheredParameters
    deepspeed.zero.GatheredParameters = lambda params, modifier_rank=None: contextlib.nullcontext()
    try:
        yield
    finally:
        deepspeed.zero.GatheredParameters = original


def _check(gram, result, grads, expected) -> None:
    gram_1, result_1, grads_1 = expected
    assert np.abs(gram - gram_1).max() <= 1e-13 * np.abs(gram_1).max()
    torch.testing.assert_close(result.counts, result_1.counts, rtol=0, atol=0)
    torch.testing.assert_close(result.losses, result_1.losses, rtol=1e-14, atol=0)
    assert (result.weights - result_1.weights).abs().max() <= 1e-12
    assert result.extras["d_norm_sq"] == pytest.approx(result_1.extras["d_norm_sq"], rel=1e-12)
    for got, want in zip(grads, grads_1):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-15 * max(want.abs().max().item(), 1.0))


@pytest.mark.timeout(120)
def test_two_ranks_take_the_one_process_step_to_float64_round_off(tmp_path):
    model, tok = multi_lora(tmp_path)
    model = model.double()
    whole = make_batch(tok, **ROWS, texts=TEXTS)
    reference = copy.deepcopy(model)
    gram, result, grads, _ = one_step(reference, FakeEngine(reference), 1, whole)
    # every objective present, with weights strictly inside the simplex: a non-trivial min-norm solve
    assert (result.counts > 0).all() and (result.weights > 0).sum() >= 2
    run_ranks(_worker, (free_port(), model, tok, (gram, result, grads)), WORLD)
