"""The bufferless Gram step (weighting.gradient_buffers: none) against the buffered one, in float64: the same Gram
the weighting sees, the same update the engine receives, the same dot products -- for full fine-tuning, LoRA,
Multi-LoRA, the MHLoss heads and a layer defined outside mtft, on mixed, padded batches, over several micro-batches,
in the optimizer's metric and with a floor; and no T × P buffer held."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mtft.adapters.multi_lora import inject_multi_lora, multi_lora_layers
from mtft.adapters.options import MultiLoraOptions
from mtft.gradients import LayerwiseGradients, PerObjectiveGradients
from mtft.training.gram_step import GramWeightedStep
from mtft.weighting import build_weighting
from tests.unit.gradients.test_gradients import MIXED, FakeEngine, lora_model, make_batch
from tests.unit.gradients.test_metric_gram import FixedMetric, SGDEngine
from tests.unit.gradients.test_multi_lora_gradients import SPANNING
from tests.unit.models.test_model import tiny_model


def full(tmp_path):
    return tiny_model(tmp_path)


def multi_lora(tmp_path):
    model, tok = tiny_model(tmp_path)
    inject_multi_lora(model.encoder, MultiLoraOptions(r=4, target_modules=["query", "value", "output.dense"]), 2, 3)
    for layer in multi_lora_layers(model):
        torch.nn.init.normal_(layer.lora_B.weight, std=0.2)
    return model, tok


def mhloss(tmp_path):
    model, tok = tiny_model(tmp_path)
    torch.manual_seed(0)
    for head in model.heads.values():  # each task's classifier as three heads (MHLoss)
        head.use_heads(3)
    return model, tok


MODELS = {"full": full, "lora": lora_model, "multi_lora": multi_lora, "mhloss": mhloss}

# rows of 3 objectives, mixed and padded; SPANNING: objective 0 has rows of both tasks
ROWS = {"mixed": MIXED, "spanning": SPANNING}


def steps(model, bufferless: bool, weights, engine=None, **options):
    params = [p for p in model.parameters() if p.requires_grad]
    weighting = options.pop("weighting", None) or Fixed(weights)
    engine = engine or FakeEngine(model)
    step = GramWeightedStep(engine, weighting, 3, 1, shared=params, bufferless=bufferless, **options)
    return step, weighting, params


class Fixed(build_weighting("mean").__class__):
    """Fixed weights, and what the step handed over."""

    name, needs_gram = "fixed_for_tests", True

    def __init__(self, weights):
        super().__init__()
        self.weights, self.seen = weights, None

    def weigh(self, losses, gram):
        self.seen = gram
        return np.asarray(self.weights, dtype=np.float64)


def run_both(make, tmp_path, micro_batches, weights=(0.5, 0.2, 0.3), **options):
    """The buffered and the bufferless step on copies of one model: (gram, update, result) of each."""
    out = []
    for bufferless in (False, True):
        model, tok = make(tmp_path / str(bufferless))
        model = model.double()
        torch.manual_seed(0)
        step, weighting, params = steps(model, bufferless, list(weights), **dict(options))
        result = step([make_batch(tok, **rows) for rows in micro_batches])
        out.append((weighting.seen, [p.grad.clone() for p in params], result, step))
    return out


@pytest.mark.parametrize("kind", sorted(MODELS))
@pytest.mark.parametrize("rows", sorted(ROWS))
def test_the_same_gram_and_update_as_the_buffered_step(tmp_path, kind, rows):
    (gram, update, _, _), (gram_l, update_l, _, step) = run_both(MODELS[kind], tmp_path, [ROWS[rows]])
    np.testing.assert_allclose(gram_l, gram, rtol=1e-12, atol=1e-15)
    assert np.abs(gram).max() > 0
    for expected, got in zip(update, update_l):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-13)
    assert step.collector.flat.numel() == 0 and not step.layerwise.tape  # no buffer; the tape freed after the step


def test_micro_batches_keep_their_cross_terms(tmp_path):
    """Two micro-batches per step: the Gram of the step's summed gradients, not the sum of two Grams."""
    halves = [
        {k: v[:4] for k, v in MIXED.items()},
        {k: v[4:] for k, v in MIXED.items()},
    ]
    (gram, update, _, _), (gram_l, update_l, _, _) = run_both(full, tmp_path, halves)
    np.testing.assert_allclose(gram_l, gram, rtol=1e-12, atol=1e-15)
    for expected, got in zip(update, update_l):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-13)


def test_lfmlf_with_a_floor_and_the_descent_check(tmp_path):
    """The real weighting decides (the same weights from the same Gram) and g_tᵀΔθ is measured from the tape."""
    results = []
    for bufferless in (False, True):
        model, tok = full(tmp_path / str(bufferless))
        model = model.double()
        weighting = build_weighting("lfmlf", {"floor": 0.2})
        engine = SGDEngine(model, lr=0.1)
        step, _, _ = steps(model, bufferless, None, engine=engine, weighting=weighting, descent_check=True)
        results.append(step([make_batch(tok, **MIXED)]))
    buffered, layerwise = results
    np.testing.assert_allclose(layerwise.weights.numpy(), buffered.weights.numpy(), rtol=1e-9, atol=1e-12)
    assert buffered.first_order is not None and layerwise.first_order is not None
    np.testing.assert_allclose(layerwise.first_order.numpy(), buffered.first_order.numpy(), rtol=1e-9, atol=1e-15)
    assert (buffered.first_order.abs() > 0).all() and buffered.extras["max_first_order"] == pytest.approx(
        layerwise.extras["max_first_order"], rel=1e-9
    )


def test_the_gram_in_the_optimizer_metric(tmp_path):
    outs = []
    for bufferless in (False, True):
        model, tok = full(tmp_path / str(bufferless))
        model = model.double()
        params = [p for p in model.parameters() if p.requires_grad]
        generator = torch.Generator().manual_seed(1)
        metric = FixedMetric({p: torch.rand(p.shape, generator=generator, dtype=p.dtype) + 0.5 for p in params})
        step, weighting, _ = steps(model, bufferless, [0.2, 0.3, 0.5], metric=metric)
        step([make_batch(tok, **MIXED)])
        outs.append(weighting.seen)
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-12, atol=1e-15)


def test_only_one_layer_of_products_at_a_time(tmp_path):
    """The bufferless path's largest transient is one layer's T products, not T × P."""
    model, tok = full(tmp_path)
    collector = PerObjectiveGradients(model, 3, dense_in_buffer=False).attach()
    layerwise = LayerwiseGradients(collector)
    detached = {n: p.detach() for n, p in model.named_parameters()}
    with collector.capturing():
        sums, _ = torch.func.functional_call(model, detached, args=(), kwargs=make_batch(tok, **MIXED))
    sums.sum().backward()
    params = [p for p in model.parameters() if p.requires_grad]
    layerwise.gram(params)
    total = 3 * sum(p.numel() for p in params) * 4
    largest = max(3 * sum(p.numel() for p in m.parameters(recurse=False) if p.requires_grad) for m in collector.modules)
    assert 0 < layerwise.peak_layer_bytes <= largest * 4 < total / 4
