"""The Gram step's ZeRO-3 path, in one process: buffers shaped from DeepSpeed's ``ds_shape`` while every parameter is
an empty placeholder, a forward pass with ``requires_grad`` off instead of the detached call, the surrogate and the
descent check inside a gather. The gathering itself is DeepSpeed's (a stand-in here that records what is asked for);
tests/e2e/test_zero3_lfmlf.py runs it for real on two processes."""

from __future__ import annotations

import contextlib
import copy

import deepspeed
import pytest
import torch

from mtft.training.gradient_store import gradient_store
from mtft.training.gram_step import GramWeightedStep, StepOptions
from tests.helpers.gradients import MIXED, FakeEngine, FixedGramWeighting, make_batch
from tests.helpers.models import tiny_model
from tests.helpers.sharded import as_partitioned


@pytest.mark.parametrize("bufferless", [False, True], ids=["buffered", "bufferless"])
def test_zero3_path_writes_the_same_update_as_the_detached_path(tmp_path, monkeypatch, bufferless):
    gathers: list[list[torch.nn.Parameter]] = []

    def gathered(params, modifier_rank=None):
        assert modifier_rank is None  # every rank gathers the same values and changes none
        gathers.append(list(params))
        return contextlib.nullcontext()

    monkeypatch.setattr(deepspeed.zero, "GatheredParameters", gathered)
    model, tok = tiny_model(tmp_path)
    model = model.double()
    twin = copy.deepcopy(model)
    batch = make_batch(tok, **MIXED)
    weights = [0.5, 0.2, 0.3]

    params = [p for p in model.parameters() if p.requires_grad]
    check = StepOptions(descent_check=True)
    expected = GramWeightedStep(gradient_store(FakeEngine(model), 3, 1, params), FixedGramWeighting(weights), check)

    twin_params = [p for p in twin.parameters() if p.requires_grad]
    data = as_partitioned(twin)
    store = gradient_store(FakeEngine(twin), 3, 1, twin_params, buffers="none" if bufferless else "full")
    step = GramWeightedStep(store, FixedGramWeighting(weights), check)
    for p, value in data.items():  # here the "gathered" data stays in place for the passes
        p.data = value
    assert step.store.model.partitioned and not expected.store.model.partitioned
    if not bufferless:
        assert [step.store.collector.gradient(p).shape for p in twin_params] == [(3, *p.shape) for p in twin_params]

    a, b = expected([dict(batch)]), step([dict(batch)])
    torch.testing.assert_close(b.losses, a.losses, rtol=0, atol=0)
    assert b.extras["d_norm_sq"] == pytest.approx(a.extras["d_norm_sq"], rel=1e-12) and b.weights.tolist() == weights
    for p, q in zip(params, twin_params):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-12, atol=1e-15)
    assert all(p.requires_grad for p in twin_params)  # switched off for the forward pass only
    # the surrogate (with θ_k for the descent check) and θ_{k+1}: two gathers of every trainable parameter
    assert [set(g) for g in gathers] == [set(twin_params)] * 2
    torch.testing.assert_close(b.first_order, a.first_order, rtol=0, atol=0)
