"""LF-MLF in the optimizer's metric: the Gram G_ts = g_tᵀPg_s of a diagonal P, its min-norm weights, and the
Gram step's descent check (g_tᵀΔθ of the update applied)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mtft.gradients import PerObjectiveGradients, per_objective, reference_objective_gradients
from mtft.training.gradient_store import gradient_store
from mtft.training.gram_step import GramWeightedStep, StepOptions
from mtft.weighting import LFMLF, MeanWeighting
from tests.helpers.gradients import MIXED, FakeEngine, FixedGramWeighting, FixedMetric, SGDEngine, make_batch
from tests.helpers.models import tiny_model


def toy_collector(gradients: list[list[float]]) -> tuple[PerObjectiveGradients, torch.nn.Parameter]:
    """A collector over one 3-parameter layer whose buffers hold the given g_t (float64)."""
    layer = torch.nn.Linear(3, 1, bias=False).double()
    collector = PerObjectiveGradients(layer, len(gradients))
    for t, g in enumerate(gradients):
        collector.views[layer.weight][t] = torch.tensor([g], dtype=torch.float64)
    return collector, layer.weight


def test_two_objectives_by_hand():
    """g_1 = (2, 0, 1), g_2 = (0, 1, 1), P = diag(1/4, 1, 1). In P's metric both gradients have ||g||²_P = 2 and
    ⟨g_1, g_2⟩_P = 1, so the min-norm point of the segment is its middle: w = (1/2, 1/2), d = (1, 1/2, 1),
    Pd = (1/4, 1/2, 1) and g_1ᵀPd = g_2ᵀPd = dᵀPd = 3/2. Euclidean (P = I) the same gradients give
    G = [[5, 1], [1, 2]] and w_1 = (G_22 − G_12)/(G_11 + G_22 − 2G_12) = 1/5."""
    collector, weight = toy_collector([[2, 0, 1], [0, 1, 1]])
    p = torch.tensor([[0.25, 1.0, 1.0]], dtype=torch.float64)

    gram_p = collector.gram([weight], metric={weight: p}).numpy()
    np.testing.assert_allclose(gram_p, [[2, 1], [1, 2]], atol=1e-15)
    w = LFMLF()(np.zeros(2), gram_p)
    np.testing.assert_allclose(w, [0.5, 0.5], atol=1e-12)
    d = w @ np.array([[2, 0, 1], [0, 1, 1]], dtype=float)
    applied = p.numpy()[0] * d  # the direction AdamW applies, momentum aside
    np.testing.assert_allclose(applied, [0.25, 0.5, 1.0], atol=1e-12)
    np.testing.assert_allclose([g @ applied for g in ([2, 0, 1], [0, 1, 1])], [1.5, 1.5], atol=1e-12)
    np.testing.assert_allclose(d @ applied, 1.5, atol=1e-12)

    euclidean = collector.gram([weight]).numpy()
    np.testing.assert_allclose(euclidean, [[5, 1], [1, 2]], atol=1e-15)
    np.testing.assert_allclose(LFMLF()(np.zeros(2), euclidean), [0.2, 0.8], atol=1e-12)
    # P = I is plain LF-MLF
    identity = collector.gram([weight], metric={weight: torch.ones(1, 3, dtype=torch.float64)}).numpy()
    np.testing.assert_array_equal(identity, euclidean)


@pytest.mark.parametrize("seed", range(20))
def test_the_applied_direction_is_a_common_descent_direction_in_the_metric(seed):
    """KKT of the min-norm problem in P's metric: g_tᵀPd ≥ dᵀPd for every t, equality on the support; and the
    weights are plain LF-MLF's of the rescaled gradients √p ⊙ g_t (the same problem, so the same direction)."""
    rng = np.random.default_rng(seed)
    T, n = 5, 3
    g = rng.normal(size=(T, n))
    g[:, 0] += 1.0  # a shared component: the hull then does not contain 0
    p = np.exp(rng.normal(scale=2.0, size=n))  # a preconditioner spanning orders of magnitude
    collector, weight = toy_collector(g.tolist())

    gram = collector.gram([weight], metric={weight: torch.tensor(p[None, :])}).numpy()
    w = LFMLF()(np.zeros(T), gram)
    d = w @ g
    margins = g @ (p * d) - d @ (p * d)
    tolerance = 1e-10 * np.abs(gram).max()  # d may be ~0 (the origin in the hull: Pareto-stationary)
    assert margins.min() >= -tolerance
    np.testing.assert_allclose(margins[w > 1e-9], 0.0, atol=tolerance)
    rescaled = LFMLF()(np.zeros(T), (g * np.sqrt(p)) @ (g * np.sqrt(p)).T)  # weights need not be unique (T > n)
    np.testing.assert_allclose(np.sqrt(p) * d, np.sqrt(p) * (rescaled @ g), atol=1e-6 * np.sqrt(np.abs(gram).max()))


def test_metric_gram_of_a_real_model_in_chunks(tmp_path, monkeypatch):
    """On a real model's per-objective gradients, G_P = Σ_θ g_tᵀPg_s formed by chunks of columns (here 1,000, so
    every parameter block is split) equals the product of the reference gradients, for the full dense block and
    for a subset of parameters."""
    model, tok = tiny_model(tmp_path, num_objectives=3)
    model.double()
    batch = make_batch(tok, **MIXED)
    collector = PerObjectiveGradients(model, 3).attach()
    detached = {n: p.detach() for n, p in model.named_parameters()}
    with collector.capturing():
        sums, _ = torch.func.functional_call(model, detached, args=(), kwargs=batch)
    sums.sum().backward()
    collector.finalize()
    params = [p for p in model.parameters() if p.requires_grad]
    generator = torch.Generator().manual_seed(0)
    metric = {p: torch.rand(p.shape, generator=generator, dtype=torch.float64) + 0.1 for p in params}
    monkeypatch.setattr(per_objective, "METRIC_CHUNK", 1000)
    for subset in (params, params[::3]):
        flat_g = reference_objective_gradients(model, batch, subset, 3)  # sums per objective, float64
        flat_p = torch.cat([metric[p].reshape(-1) for p in subset])
        expected = (flat_g * flat_p) @ flat_g.t()
        torch.testing.assert_close(collector.gram(subset, metric=metric), expected, rtol=1e-10, atol=1e-12)


def test_the_step_hands_the_weighting_the_metric_gram(tmp_path):
    model, tok = tiny_model(tmp_path, num_objectives=3)
    model.double()
    batch = make_batch(tok, **MIXED)
    params = [p for p in model.parameters() if p.requires_grad]
    metric = {p: torch.full(p.shape, 1.0 + i, dtype=torch.float64) for i, p in enumerate(params)}
    counts = model(**batch)[1].detach()
    weighting = FixedGramWeighting()
    options = StepOptions(metric=FixedMetric(metric))
    step = GramWeightedStep(gradient_store(FakeEngine(model), 3, 1, params), weighting, options)
    result = step([batch])
    flat_g = reference_objective_gradients(model, batch, params, 3) / counts[:, None]
    flat_p = torch.cat([metric[p].reshape(-1) for p in params])
    np.testing.assert_allclose(weighting.seen, ((flat_g * flat_p) @ flat_g.t()).numpy(), rtol=1e-10)
    assert result.extras["metric_preconditioned"] == 1.0
    # before AdamW's first step the metric is Euclidean, and the step says so
    weighting = FixedGramWeighting()
    options = StepOptions(metric=FixedMetric({p: None for p in params}))
    step = GramWeightedStep(gradient_store(FakeEngine(model), 3, 1, params), weighting, options)
    step.options.metric.diagonal = lambda params: None
    result = step([batch])
    np.testing.assert_allclose(weighting.seen, (flat_g @ flat_g.t()).numpy(), rtol=1e-10)
    assert result.extras["metric_preconditioned"] == 0.0


@pytest.mark.parametrize("weighting", [LFMLF(), MeanWeighting()], ids=["lfmlf", "mean"])
def test_descent_check_measures_the_first_order_change_of_the_applied_update(tmp_path, weighting):
    """With θ ← θ − lr·Σ_s w_s g_s the first-order change of objective t is −lr·g_tᵀΣ_s w_s g_s over every
    trainable parameter (private heads included); LF-MLF's d over the shared parameters makes it negative for
    every objective when every parameter is shared. A weighting that reads no Gram gets the same check."""
    model, tok = tiny_model(tmp_path, num_objectives=3)
    model.double()
    batch = make_batch(tok, **MIXED)
    params = [p for p in model.parameters() if p.requires_grad]
    counts = model(**batch)[1].detach()
    flat_g = reference_objective_gradients(model, batch, params, 3) / counts[:, None]
    lr = 1e-3
    shared = params if weighting.needs_gram else None
    options = StepOptions(descent_check=True)
    step = GramWeightedStep(gradient_store(SGDEngine(model, lr), 3, 1, shared), weighting, options)
    result = step([batch])
    w = result.weights
    expected = -lr * flat_g @ (w @ flat_g)
    torch.testing.assert_close(result.first_order, expected, rtol=1e-8, atol=0.0)
    assert result.extras["common_descent"] == float(bool((expected < 0).all()))
    assert result.extras["max_first_order"] == pytest.approx(float(expected.max()))
    if weighting.needs_gram:  # the Gram over every trainable parameter: Theorem 2 for the update applied
        assert result.extras["common_descent"] == 1.0
        assert "d_norm_sq" in result.extras
    else:
        assert "d_norm_sq" not in result.extras  # no Gram formed


def test_descent_check_marks_absent_objectives_and_a_step_that_does_not_move(tmp_path):
    model, tok = tiny_model(tmp_path, num_objectives=4)
    batch = make_batch(tok, **MIXED)  # objective 3 is absent
    step = GramWeightedStep(gradient_store(FakeEngine(model), 4, 1), LFMLF(), StepOptions(descent_check=True))
    step.store.shared = [p for p in model.parameters() if p.requires_grad]
    result = step([batch])
    assert torch.isnan(result.first_order[3])
    assert (result.first_order[:3] == 0).all()  # FakeEngine.step() applies nothing
    assert result.extras["common_descent"] == 0.0 and result.extras["descent_fraction"] == 0.0
