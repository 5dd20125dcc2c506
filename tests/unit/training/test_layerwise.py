"""The bufferless Gram step (gradients.buffers: none) against the buffered one, in float64: the same Gram
the weighting sees, the same update the engine receives, the same dot products -- for full fine-tuning, LoRA,
Multi-LoRA, the MHLoss heads and a layer defined outside mtft, on mixed, padded batches, over several micro-batches,
in the optimizer's metric and with a floor; and no T × P buffer held."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mtft.core.errors import ConfigError
from mtft.gradients import LayerwiseGradients, PerObjectiveGradients
from mtft.gradients.layerwise import CHUNK_OBJECTIVES, MIN_CHUNK_BYTES
from mtft.training.gradient_store import gradient_store
from mtft.training.gram_step import GramWeightedStep, StepOptions
from mtft.weighting import build_weighting
from tests.helpers.gradients import MIXED, SPANNING, FakeEngine, FixedMetric, SGDEngine, make_batch
from tests.helpers.layerwise import MODELS, ONE_HEAD, Fixed, full

ROWS = {"mixed": MIXED, "spanning": SPANNING, "one_head": ONE_HEAD}


def steps(model, bufferless: bool, weights, engine=None, **options):
    params = [p for p in model.parameters() if p.requires_grad]
    weighting = options.pop("weighting", None) or Fixed(weights)
    engine = engine or FakeEngine(model)
    buffers, update = "none" if bufferless else "full", "backward" if options.pop("second_backward", False) else "tape"
    check = options.get("descent_check", False)
    store = gradient_store(engine, 3, 1, params, buffers=buffers, update=update, descent_check=check)
    return GramWeightedStep(store, weighting, StepOptions(**options)), weighting, params


def run_both(make, tmp_path, micro_batches, weights=(0.5, 0.2, 0.3), chunked=False, second_backward=False, **options):
    """The buffered and the bufferless step on copies of one model: (gram, update, result) of each. ``chunked``:
    the bufferless step forms its layers in chunks (:func:`small_chunks`); ``second_backward``: it forms the Gram
    during the backward pass and the update by a second one (``gradients.update: backward``)."""
    out = []
    for bufferless in (False, True):
        model, tok = make(tmp_path / str(bufferless))
        model = model.double()
        torch.manual_seed(0)
        own = dict(options, second_backward=True) if bufferless and second_backward else dict(options)
        step, weighting, params = steps(model, bufferless, list(weights), **own)
        if bufferless and chunked:
            step.store.layerwise.chunk_elements = small_chunks(model) // (3 * 8)
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
    store = step.store
    assert store.collector.flat.numel() == 0 and not store.layerwise.tape  # no buffer; the tape freed after the step


# every model and row layout in chunks (the path that cuts layers), two whole
SECOND_BACKWARD = [(kind, rows, True) for kind in sorted(MODELS) for rows in sorted(ROWS)] + [
    ("full", "mixed", False),
    ("multi_lora", "spanning", False),
]


@pytest.mark.parametrize("kind, rows, chunked", SECOND_BACKWARD)
def test_the_gram_during_the_backward_pass_and_a_second_backward(tmp_path, kind, rows, chunked):
    """gradients.update: backward -- no tape; the Gram formed at each layer's hook, the update from a second backward
    pass of the weighted losses: the buffered step's Gram and update, to float64 round-off."""
    (gram, update, _, _), (gram_l, update_l, _, step) = run_both(
        MODELS[kind], tmp_path, [ROWS[rows]], chunked=chunked, second_backward=True
    )
    np.testing.assert_allclose(gram_l, gram, rtol=1e-12, atol=1e-15)
    assert np.abs(gram).max() > 0
    for expected, got in zip(update, update_l):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-13)
    layerwise = step.store.layerwise
    assert not layerwise.tape and layerwise.live is None and layerwise.peak_layer_bytes > 0


def test_the_second_backward_in_the_optimizer_metric(tmp_path):
    outs = []
    for bufferless in (False, True):
        model, tok = full(tmp_path / str(bufferless))
        model = model.double()
        step, weighting, _ = steps(
            model, bufferless, [0.2, 0.3, 0.5], metric=random_metric(model), second_backward=bufferless
        )
        step([make_batch(tok, **MIXED)])
        outs.append(weighting.seen)
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-12, atol=1e-15)


def test_the_second_backward_refuses_what_it_cannot_form(tmp_path):
    """Two micro-batches (their cross terms) and the descent check (it re-forms the products) need the tape: the
    store's factory refuses them in one line (the rule's, mtft.config.bufferless), and a step handed two micro-batches
    all the same stops; a layer run twice in one step (its calls' products summed before the Gram) is refused too."""
    model, tok = full(tmp_path)
    model = model.double()
    params = [p for p in model.parameters() if p.requires_grad]
    for override, message in [
        ({"micro_batches": 2}, "exact for one micro-batch a step .* use gradients.update=tape"),
        ({"descent_check": True}, "re-forms the per-objective products after the step"),
    ]:
        with pytest.raises(ConfigError, match=message):
            gradient_store(FakeEngine(model), 3, 1, params, buffers="none", update="backward", **override)
    step, _, _ = steps(model, True, [0.5, 0.2, 0.3], second_backward=True)
    halves = [{k: v[:4] for k, v in MIXED.items()}, {k: v[4:] for k, v in MIXED.items()}]
    with pytest.raises(RuntimeError, match="one micro-batch a step"):
        step([make_batch(tok, **rows) for rows in halves])
    step, _, _ = steps(model, True, [0.5, 0.2, 0.3], second_backward=True)
    intermediate = model.encoder.encoder.layer[0].intermediate
    dense, act = intermediate.dense, intermediate.intermediate_act_fn
    intermediate.forward = lambda h: act(2 * dense(h) - dense(h))  # the same output, its Linear run twice
    with pytest.raises(RuntimeError, match="ran twice in one step: .* use gradients.update=tape"):
        step([make_batch(tok, **MIXED)])


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


def random_metric(model) -> FixedMetric:
    """A seeded positive diagonal metric over every trainable parameter (the optimizer's, in the tests)."""
    generator = torch.Generator().manual_seed(1)
    params = [p for p in model.parameters() if p.requires_grad]
    return FixedMetric({p: torch.rand(p.shape, generator=generator, dtype=p.dtype) + 0.5 for p in params})


def test_the_gram_in_the_optimizer_metric(tmp_path):
    outs = []
    for bufferless in (False, True):
        model, tok = full(tmp_path / str(bufferless))
        model = model.double()
        step, weighting, _ = steps(model, bufferless, [0.2, 0.3, 0.5], metric=random_metric(model))
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


# a tenth of the tiny model's largest layer per objective: every Linear formed in windows of its rows, the word
# embedding in windows of its touched rows, the Multi-LoRA B stacks in windows of their slots
def small_chunks(model) -> int:
    largest = max(p.numel() for p in model.parameters() if p.requires_grad and p.dim() == 2)
    return 3 * (largest // 10) * 8  # T = 3, float64


@pytest.mark.parametrize("kind", sorted(MODELS))
@pytest.mark.parametrize("rows", sorted(ROWS))
def test_a_layer_in_chunks_gives_the_same_gram_and_update(tmp_path, kind, rows):
    """Chunked (the memory of a chunk, not T × P_layer): the same Gram and update, to float64 round-off."""
    (gram, update, _, _), (gram_l, update_l, _, step) = run_both(MODELS[kind], tmp_path, [ROWS[rows]], chunked=True)
    np.testing.assert_allclose(gram_l, gram, rtol=1e-12, atol=1e-15)
    for expected, got in zip(update, update_l):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-13)
    layerwise = step.store.layerwise
    # at most the budget and two rows: a window holds one row when a row exceeds the budget (a Multi-LoRA slot's B),
    # and a row-sparse window has its discard slot
    widest_row = max(p[0].numel() for p in step.store.model.trainable if p.dim() >= 2)
    assert 0 < layerwise.peak_layer_bytes <= (layerwise.chunk_elements + 2 * widest_row) * 3 * 8


def test_chunks_with_the_metric_and_the_descent_check(tmp_path):
    """In the optimizer's metric and with g_tᵀΔθ: both read a chunk's window of the metric and of the update."""
    results = []
    for bufferless in (False, True):
        model, tok = full(tmp_path / str(bufferless))
        model = model.double()
        metric = random_metric(model)
        weighting = build_weighting("lfmlf", {"floor": 0.2})
        step, _, _ = steps(
            model,
            bufferless,
            None,
            engine=SGDEngine(model, lr=0.1),
            weighting=weighting,
            metric=metric,
            descent_check=True,
        )
        if bufferless:
            step.store.layerwise.chunk_elements = small_chunks(model) // (3 * 8)
        results.append(step([make_batch(tok, **MIXED)]))
    buffered, chunked = results
    np.testing.assert_allclose(chunked.weights.numpy(), buffered.weights.numpy(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(chunked.first_order.numpy(), buffered.first_order.numpy(), rtol=1e-9, atol=1e-15)


WHOLE, DEFAULT, FIXED = 1 << 40, None, 1 << 16  # chunk budgets: never chunk, CHUNK_OBJECTIVES' worth, 64 KiB


def test_the_memory_of_the_products_does_not_grow_with_the_objectives(tmp_path):
    """Formed whole, one layer's products at T = 48 are 16 times T = 3's; in chunks they stay within the budget at
    both: a fixed one, and the default (CHUNK_OBJECTIVES objectives' worth of the largest layer, at least
    MIN_CHUNK_BYTES: the same at any T)."""
    peaks, budgets = {}, {}
    model, tok = full(tmp_path)
    for objectives in (3, 48):
        for chunk_bytes in (WHOLE, DEFAULT, FIXED):
            model.num_objectives = objectives
            collector = PerObjectiveGradients(model, objectives, dense_in_buffer=False).attach()
            layerwise = LayerwiseGradients(collector, chunk_bytes=chunk_bytes)
            batch = make_batch(tok, **MIXED)
            batch["objective_index"] = batch["objective_index"] * (objectives // 3)  # 3 of the T present
            detached = {n: p.detach() for n, p in model.named_parameters()}
            with collector.capturing():
                sums, _ = torch.func.functional_call(model, detached, args=(), kwargs=batch)
            sums.sum().backward()
            layerwise.gram([p for p in model.parameters() if p.requires_grad])
            peaks[objectives, chunk_bytes] = layerwise.peak_layer_bytes
            budgets[objectives, chunk_bytes] = layerwise.chunk_elements * objectives * 4
            collector.detach()
    assert peaks[48, WHOLE] >= 8 * peaks[3, WHOLE] > 0
    widest_row = max(p[0].numel() for p in model.parameters() if p.dim() == 2)
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules() if len(m._parameters))
    for objectives in (3, 48):
        default = max(CHUNK_OBJECTIVES * largest * 4, MIN_CHUNK_BYTES)
        assert budgets[objectives, DEFAULT] == pytest.approx(default, rel=0.01)
    for objectives in (3, 48):
        for chunk_bytes in (DEFAULT, FIXED):
            assert (
                0 < peaks[objectives, chunk_bytes] <= budgets[objectives, chunk_bytes] + 2 * objectives * widest_row * 4
            )
    assert peaks[48, FIXED] < peaks[48, WHOLE] / 4
