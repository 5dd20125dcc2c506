"""Activation checkpointing with the per-objective hooks: every layer's products counted once, from the recomputed
input -- the same Gram and update as without checkpointing (float64), buffered and bufferless, for full fine-tuning,
LoRA and Multi-LoRA; the plain step too; and the first pass keeps no input of a recomputed layer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mtft.models.checkpointing import enable_checkpointing, recomputed_modules
from mtft.training.gradient_store import gradient_store
from mtft.training.gram_step import GramWeightedStep
from mtft.training.step import LossWeightedStep
from mtft.weighting import MeanWeighting
from tests.helpers.gradients import MIXED, FakeEngine, make_batch
from tests.helpers.layerwise import MODELS, ONE_HEAD, Fixed


def halves(rows):
    return [{k: v[:4] for k, v in rows.items()}, {k: v[4:] for k, v in rows.items()}]


def gram_step(make, tmp_path, checkpointing: bool, bufferless: bool, second_backward: bool = False, rows=MIXED):
    model, tok = make(tmp_path)
    model = model.double().train()
    if checkpointing:
        enable_checkpointing(model.encoder)
    params = [p for p in model.parameters() if p.requires_grad]
    weighting = Fixed([0.5, 0.2, 0.3])
    update = "backward" if second_backward else "tape"
    store = gradient_store(FakeEngine(model), 3, 1, params, buffers="none" if bufferless else "full", update=update)
    step = GramWeightedStep(store, weighting)
    micro_batches = [rows] if second_backward else halves(rows)  # the second backward pass: one micro-batch a step
    result = step([make_batch(tok, **part) for part in micro_batches])
    return weighting.seen, [p.grad.clone() for p in params], step, result


MODES = {"buffered": (False, False), "bufferless": (True, False), "second_backward": (True, True)}


@pytest.mark.parametrize("kind", ["full", "lora", "multi_lora"])
@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("rows", ["mixed", "one_head"])
def test_the_same_gram_and_update_with_checkpointing(tmp_path, kind, mode, rows):
    """With the second backward pass (gradients.update: backward) the checkpointed layers are recomputed twice,
    once in each backward pass, and hand their input over both times. ``one_head``: the second task's head runs on
    no rows."""
    layout = {"mixed": MIXED, "one_head": ONE_HEAD}[rows]
    gram, update, _, plain = gram_step(MODELS[kind], tmp_path / "a", False, *MODES[mode], rows=layout)
    gram_c, update_c, step, result = gram_step(MODELS[kind], tmp_path / "b", True, *MODES[mode], rows=layout)
    assert step.store.collector.recomputed  # the encoder's layers are recomputed
    assert not step.store.collector._inputs and not step.store.collector._waiting
    np.testing.assert_allclose(gram_c, gram, rtol=1e-12, atol=1e-15)
    for expected, got in zip(update, update_c):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-13)
    torch.testing.assert_close(result.losses, plain.losses, rtol=1e-12, atol=0)


def test_only_the_encoder_layers_are_recomputed(tmp_path):
    model, _ = MODELS["full"](tmp_path)
    assert recomputed_modules(model) == set()
    enable_checkpointing(model.encoder)
    recomputed = recomputed_modules(model)
    layers = list(model.encoder.encoder.layer)
    inside = {m for layer in layers for m in layer.modules() if m is not layer}
    assert recomputed == inside and not any(m in recomputed for m in model.encoder.embeddings.modules())


def test_the_first_pass_keeps_no_input_of_a_recomputed_layer(tmp_path, monkeypatch):
    """Checkpointing frees a layer's activations: the hooks must not hold them. Every hooked layer inside the
    checkpointed ones gets its input from the recomputation, paired with its output gradient (once per call)."""
    model, tok = MODELS["full"](tmp_path)
    model = model.double().train()
    enable_checkpointing(model.encoder)
    params = [p for p in model.parameters() if p.requires_grad]
    step = GramWeightedStep(gradient_store(FakeEngine(model), 3, 1, params, buffers="none"), Fixed([0.5, 0.2, 0.3]))
    first_pass, paired = [], []
    hook, pair = step.store.collector._forward_hook, step.store.collector._pair

    def forward_hook(module, inputs, output):
        out = hook(module, inputs, output)
        if step.store.collector._active and module in step.store.collector.recomputed:
            first_pass.append(module)
        return out

    def pairing(module):
        if step.store.collector._inputs.get(module) and step.store.collector._waiting.get(module):
            paired.append(module)
        pair(module)

    monkeypatch.setattr(step.store.collector, "_pair", pairing)
    step.store.collector.detach()
    step.store.collector._forward_hook = forward_hook
    step.store.collector.attach()
    step([make_batch(tok, **MIXED)])
    hooked = [m for m in step.store.collector.modules if m in step.store.collector.recomputed]
    assert hooked and sorted(map(id, first_pass)) == sorted(map(id, hooked)) == sorted(map(id, paired))


def test_the_plain_step_with_checkpointing(tmp_path):
    grads = []
    for checkpointing in (False, True):
        model, tok = MODELS["lora"](tmp_path / str(checkpointing))
        model = model.double().train()
        if checkpointing:
            enable_checkpointing(model.encoder)
        LossWeightedStep(FakeEngine(model), MeanWeighting(), 3, 1)([make_batch(tok, **MIXED)])
        grads.append([p.grad.clone() for p in model.parameters() if p.requires_grad])
    for expected, got in zip(*grads):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-13)
