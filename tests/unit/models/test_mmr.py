"""The max-margin regulariser (Fu, So & Collier, 2023, eq. 8-9): its value, its multi-class generalisation, the
one-class batch, α = 0, its gradient, and how it joins the model's per-objective losses."""

from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch

from mtft.core.labels import IGNORE_INDEX
from mtft.gradients import reference_objective_gradients
from mtft.models.heads import SequenceClassificationHead
from mtft.models.mmr import margin_regulariser
from mtft.models.regression_head import RegressionHead
from mtft.training.step import LossWeightedStep
from mtft.weighting.mean import MeanWeighting
from tests.helpers.gradients import MIXED, FakeEngine, gram_step_against_weighted_loss, hooked_gradients, make_batch
from tests.helpers.models import batch, tiny_model


def paper_formula(features: list[list[float]], y: list[int]) -> float:
    """Eq. 8 written out literally with y ∈ {−1, +1}, in plain Python."""
    plus = sum(1 + yj for yj in y)
    minus = sum(1 - yj for yj in y)
    total = [0.0] * len(features[0])
    for x, yi in zip(features, y):
        coefficient = yi * ((1 + yi) / plus + (1 - yi) / minus)
        total = [t + coefficient * v for t, v in zip(total, x)]
    return 1.0 / (1.0 + math.sqrt(sum(t * t for t in total)))


FEATURES = [[1.0, 2.0, 0.5], [0.0, -1.0, 2.0], [3.0, 1.0, -1.0], [-2.0, 0.5, 0.0], [1.5, 1.5, 1.5]]
Y = [1, -1, 1, -1, -1]


def pytest_approx(x: float):
    return pytest.approx(x, rel=1e-12, abs=1e-14)


def test_binary_value_is_the_papers_formula():
    classes = torch.tensor([1 if y == 1 else 0 for y in Y])
    value = margin_regulariser(torch.tensor(FEATURES, dtype=torch.float64), classes)
    assert value is not None
    assert float(value) == pytest_approx(paper_formula(FEATURES, Y))
    # the class ids' order does not matter: the same two groups with ids swapped
    swapped = margin_regulariser(torch.tensor(FEATURES, dtype=torch.float64), 1 - classes)
    assert swapped is not None and float(swapped) == pytest_approx(float(value))


def test_multiclass_value_is_one_over_one_plus_the_mean_pairwise_centre_distance():
    features = [[0.0, 0.0], [2.0, 0.0], [4.0, 3.0], [4.0, 5.0], [-1.0, 1.0], [-3.0, 1.0], [7.0, 7.0]]
    classes = [0, 0, 1, 1, 2, 2, IGNORE_INDEX]  # the last row carries no label and takes no part
    centres = {}
    for k in (0, 1, 2):
        rows = [f for f, c in zip(features, classes) if c == k]
        centres[k] = [sum(r[d] for r in rows) / len(rows) for d in range(2)]
    # by hand: centres (1, 0), (4, 4), (-2, 1); distances 5, sqrt(45), sqrt(10)
    assert centres == {0: [1.0, 0.0], 1: [4.0, 4.0], 2: [-2.0, 1.0]}
    distances = [math.dist(centres[a], centres[b]) for a, b in itertools.combinations((0, 1, 2), 2)]
    expected = 1.0 / (1.0 + sum(distances) / 3)
    value = margin_regulariser(torch.tensor(features, dtype=torch.float64), torch.tensor(classes))
    assert value is not None and float(value) == pytest_approx(expected)


def test_two_of_several_classes_present_gives_the_binary_formula():
    # classes 0 and 2 of a three-class head: the generalisation is exactly eq. 8 on the two present classes
    classes = torch.tensor([2 if y == 1 else 0 for y in Y])
    value = margin_regulariser(torch.tensor(FEATURES, dtype=torch.float64), classes)
    assert value is not None and float(value) == pytest_approx(paper_formula(FEATURES, Y))


def test_fewer_than_two_classes_is_undefined_not_nan():
    features = torch.randn(4, 3)
    assert margin_regulariser(features, torch.tensor([1, 1, 1, 1])) is None
    assert margin_regulariser(features, torch.tensor([1, IGNORE_INDEX, 1, IGNORE_INDEX])) is None
    assert margin_regulariser(features[:0], torch.tensor([], dtype=torch.long)) is None


def test_coinciding_centres_give_one_and_a_finite_gradient():
    features = torch.tensor([[1.0, 2.0], [1.0, 2.0]], requires_grad=True)
    value = margin_regulariser(features, torch.tensor([0, 1]))
    assert value is not None and float(value.detach()) == 1.0
    value.backward()
    assert features.grad is not None and torch.isfinite(features.grad).all()


def test_gradient_moves_the_centres_apart():
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(8, 4, generator=generator, dtype=torch.float64, requires_grad=True)
    classes = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    value = margin_regulariser(features, classes)
    assert value is not None
    (gradient,) = torch.autograd.grad(value, features)
    assert gradient.abs().sum() > 0
    stepped = margin_regulariser(features.detach() - 0.1 * gradient, classes)
    assert stepped is not None and float(stepped) < float(value.detach())


def mmr_model(tmp_path, alpha):
    model, tok = tiny_model(tmp_path)
    model.mmr = alpha
    return model, tok


def test_model_adds_alpha_r_per_loss_unit_of_each_objective(tmp_path):
    plain, tok = mmr_model(tmp_path, 0.0)
    regularised = copy.deepcopy(plain)
    regularised.mmr = 0.5
    # head a: objective 0 holds both classes, objective 1 one class (no term); head b: objective 2, unlabelled row
    b = batch(tok, heads=[0, 0, 0, 1], objectives=[0, 0, 1, 2], labels=[0, 1, 1, 2])
    b["labels"] = torch.tensor([0, 1, 1, 2])
    sums0, counts0 = plain(**b)
    sums1, counts1 = regularised(**b)
    assert torch.equal(counts0, counts1)
    hidden = plain.encoder(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).last_hidden_state
    features = plain.heads["a"].features(hidden[:2])
    r = margin_regulariser(features, torch.tensor([0, 1]))
    assert r is not None
    assert torch.allclose(sums1[0], sums0[0] + 0.5 * r * 2)  # two loss units
    assert torch.equal(sums1[1:], sums0[1:])  # one class: nothing; head b's objective 2: one class, nothing
    assert regularised.drain_regularisers() == {"mmr/a": float(r.detach())}
    assert regularised.drain_regularisers() == {}


def test_model_skips_heads_that_do_not_classify(tmp_path):
    model, tok = mmr_model(tmp_path, 1.0)
    model.heads["b"] = RegressionHead(64, ["score"], 0.0)
    b = batch(tok, heads=[1, 1, 1, 1], objectives=[2, 2, 2, 2], labels=[0.5, 1.5, 2.5, 3.0])
    b["labels"] = torch.tensor([0.5, 1.5, 2.5, 3.0], dtype=torch.float64)
    model(**b)
    assert model.drain_regularisers() == {}


def test_eval_mode_returns_the_task_loss(tmp_path):
    plain, tok = mmr_model(tmp_path, 0.0)
    regularised = copy.deepcopy(plain)
    regularised.mmr = 2.0
    b = batch(tok, heads=[0, 0, 1, 1], objectives=[0, 0, 2, 2], labels=[0, 1, 0, 2])
    regularised.eval()
    assert torch.equal(plain(**b)[0], regularised(**b)[0])


def test_alpha_zero_is_bit_identical_to_plain_fine_tuning(tmp_path):
    plain, tok = tiny_model(tmp_path)
    off = copy.deepcopy(plain)
    off.mmr = 0.0
    on = copy.deepcopy(plain)
    on.mmr = 0.7
    b = batch(tok, heads=[0, 0, 1, 1], objectives=[0, 0, 2, 2], labels=[0, 1, 0, 2])

    def step(model):
        result = LossWeightedStep(FakeEngine(model), MeanWeighting(), 3, 1)([b])
        return result, [p.grad.clone() for p in model.parameters() if p.grad is not None]

    plain_result, plain_grads = step(plain)
    off_result, off_grads = step(off)
    on_result, on_grads = step(on)
    assert torch.equal(torch.nan_to_num(plain_result.losses), torch.nan_to_num(off_result.losses))
    assert all(torch.equal(a, c) for a, c in zip(plain_grads, off_grads))
    assert "mmr/a" not in off_result.extras
    # and α > 0 changes both, and logs R per head
    assert not torch.equal(torch.nan_to_num(plain_result.losses), torch.nan_to_num(on_result.losses))
    assert not all(torch.equal(a, c) for a, c in zip(plain_grads, on_grads))
    assert set(on_result.extras) >= {"mmr/a", "mmr/b"}
    assert all(0 < on_result.extras[k] <= 1 for k in ("mmr/a", "mmr/b"))


def test_regulariser_gradient_reaches_the_encoder(tmp_path):
    model, tok = mmr_model(tmp_path, 1.0)
    b = batch(tok, heads=[0, 0, 0, 0], objectives=[0, 0, 0, 0], labels=[0, 1, 0, 1])
    # the regulariser alone: subtract the task loss, computed with the regulariser off
    sums, _ = model(**b)
    model.mmr = 0.0
    plain_sums, _ = model(**b)
    (sums[0] - plain_sums[0]).backward()
    encoder_grads = [p.grad for p in model.encoder.parameters() if p.grad is not None]
    assert encoder_grads and any(g.abs().sum() > 0 for g in encoder_grads)
    assert model.heads["a"].out_proj.weight.grad is None or model.heads["a"].out_proj.weight.grad.abs().sum() == 0


def test_head_features_are_the_input_of_the_final_linear_layer():
    head = SequenceClassificationHead(8, ["x", "y"], 0.0)
    hidden = torch.randn(3, 5, 8)
    out = head(hidden, torch.tensor([0, 1, IGNORE_INDEX]))
    assert out.features is not None and out.classes is not None
    assert torch.allclose(head.out_proj(out.features), out.logits)
    assert out.classes.tolist() == [0, 1, IGNORE_INDEX]


def test_an_mhloss_head_hands_the_regulariser_the_features_all_its_heads_share():
    torch.manual_seed(0)
    head = SequenceClassificationHead(8, ["x", "y"], 0.0)
    head.use_heads(3)
    hidden = torch.randn(4, 5, 8)
    out = head(hidden, torch.tensor([0, 1, 1, IGNORE_INDEX]))
    assert out.features is not None and out.classes is not None
    assert torch.equal(out.features, head.features(hidden))
    per_head = head.project(out.features, per_head=True)
    assert per_head.shape[0] == 3 and torch.allclose(per_head.mean(0), out.logits)
    assert out.classes.tolist() == [0, 1, 1, IGNORE_INDEX]


def test_per_objective_gradients_with_the_regulariser_equal_the_float64_reference(tmp_path):
    """Gram weightings see R: each objective's hooked gradient is the exact gradient of its sum, R included."""
    model, tok = mmr_model(tmp_path, 0.8)
    model = model.double()
    batch = make_batch(tok, **MIXED)  # head a: objective 1 has both classes, objective 2 one; head b: two classes
    got, params = hooked_gradients(model, batch, 3)
    assert set(model.drain_regularisers()) == {"mmr/a", "mmr/b"}
    expected = reference_objective_gradients(model, batch, params, 3)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    model.mmr = 0.0
    plain = reference_objective_gradients(model, batch, params, 3)
    assert not torch.allclose(plain[[0, 1]], expected[[0, 1]])  # R changed the objectives that have one
    torch.testing.assert_close(plain[2], expected[2], rtol=0, atol=0)  # one class: untouched


def test_gram_step_update_is_the_gradient_of_the_weighted_regularised_loss(tmp_path):
    model, tok = mmr_model(tmp_path, 0.8)
    result = gram_step_against_weighted_loss(model.double(), make_batch(tok, **MIXED), [0.5, 0.2, 0.3])
    assert set(result.extras) >= {"mmr/a", "mmr/b"}
