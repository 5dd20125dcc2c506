"""The monitors' ZeRO-3 replica: a plain copy keeps tied weights tied and the model's own hooks, and drops what
DeepSpeed attached (tests/e2e/test_forgetting_run.py runs it against real partitions on two processes)."""

from __future__ import annotations

import torch
from torch import nn

from mtft.forgetting.replica import plain_copy


def _deepspeed_hook(module, args):
    raise AssertionError("a ZeRO-3 hook ran on the replica")


_deepspeed_hook.__module__ = "deepspeed.runtime.zero.parameter_offload"


def test_plain_copy_keeps_ties_and_own_hooks_and_drops_deepspeeds():
    model = nn.Sequential(nn.Embedding(5, 4), nn.Linear(4, 5))
    model[1].weight = model[0].weight  # tied, as a masked-LM decoder and its word embeddings
    model[1].weight.ds_id = 7  # an attribute DeepSpeed sets on its parameters
    model[1]._original_parameters = dict(model[1]._parameters)
    calls = []
    model[1].register_forward_pre_hook(lambda module, args: calls.append("own"))
    model[1].register_forward_pre_hook(_deepspeed_hook)
    model[0].register_forward_hook(_deepspeed_hook, with_kwargs=True)

    replica = plain_copy(model)
    assert replica[1].weight is replica[0].weight and replica[0].weight is not model[0].weight
    assert not hasattr(replica[1].weight, "ds_id") and not hasattr(replica[1], "_original_parameters")
    torch.testing.assert_close(replica[0].weight, model[0].weight, rtol=0, atol=0)
    replica(torch.tensor([1, 2]))  # the DeepSpeed hooks would raise
    assert calls == ["own"]
    with torch.no_grad():
        replica[0].weight.add_(1.0)  # its own storage
    assert not torch.equal(replica[0].weight, model[0].weight)
