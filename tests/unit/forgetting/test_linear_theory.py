"""The theory check of Springer et al. (2025, Section 4) on the two-layer linear network: incremental, sigmoidal
learning of A_pre's singular values (Theorem 4.1) and progressive sensitivity to a fixed Gaussian perturbation applied
by the product's own probe (Proposition 4.3)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mtft.forgetting import linear_theory as lt


@pytest.fixture(scope="module")
def run():
    torch.set_num_threads(1)
    _, target, trajectory = lt.train(lt.SINGULAR_VALUES, lt.STEPS, lt.LR, lt.INIT_STD)
    return target, trajectory


def test_training_reaches_the_target(run):
    target, trajectory = run
    assert trajectory.loss[0] == pytest.approx(float(target.pow(2).sum()), rel=1e-6)
    assert trajectory.loss[-1] < 1e-6 * trajectory.loss[0]
    np.testing.assert_allclose(trajectory.projected[-1], lt.SINGULAR_VALUES, rtol=1e-4)


def test_singular_values_are_learnt_in_order_of_size(run):
    _, trajectory = run
    half = trajectory.half_times()
    assert np.all(np.diff(half) > 0), half  # σ = 8, 7, …, 1: later for every smaller σ


def test_each_singular_value_rises_sigmoidally(run):
    _, trajectory = run
    steps = trajectory.steps.astype(float)
    for sigma, curve, half in zip(lt.SINGULAR_VALUES, trajectory.projected.T, trajectory.half_times()):
        rise = np.diff(curve)
        assert rise.min() > -1e-9 * sigma, f"σ={sigma} is not monotone"
        fastest = int(np.argmax(rise))  # steepest step sits at the half-time, as on a logistic curve
        assert abs(fastest - half) <= 2, (sigma, fastest, half)
        params, residual = lt.fit_logistic(steps, curve, sigma)
        assert residual < 0.02, (sigma, residual)
        assert params[0] == pytest.approx(sigma, rel=0.01)
        assert abs(params[2] - half) <= 2


def test_checkpoints_sit_on_the_plateaus_of_k_learnt_values(run):
    _, trajectory = run
    sigma = np.array(lt.SINGULAR_VALUES)
    for k, index in enumerate(trajectory.checkpoints()):
        ratio = trajectory.projected[index] / sigma
        assert np.all(ratio[:k] > 0.8) and np.all(ratio[k:] < 0.2), (k, ratio.round(2))


@pytest.fixture(scope="module")
def sensitivity(run):
    target, trajectory = run
    return lt.sensitivity_by_learnt(trajectory, target, lt.INIT_STD, lt.GAMMA, lt.SEEDS)


def test_perturbation_loss_increase_grows_with_the_singular_values_learnt(sensitivity):
    means = [row["delta_loss_mean"] for row in sensitivity]
    assert np.all(np.diff(means) > 0), np.round(means, 3)
    expected = [row["delta_loss_expected"] for row in sensitivity]
    assert np.all(np.diff(expected) > 0)
    assert expected[-1] > 50 * expected[0]  # ≈ 2dγ²Σσ_i on top of the d³γ⁴ of an untrained net
    assert means[-1] - means[0] > 20 * (np.std(sensitivity[-1]["delta_loss"]) / np.sqrt(lt.SEEDS))


def test_the_probe_mean_estimates_the_closed_form_expectation(sensitivity):
    for row in sensitivity:
        draws = np.array(row["delta_loss"])
        error = draws.std(ddof=1) / np.sqrt(len(draws))
        assert abs(draws.mean() - row["delta_loss_expected"]) < 4 * error, row["learnt"]


def test_every_checkpoint_gets_the_same_noise_and_the_weights_come_back(run):
    target, _ = run
    net = lt.TwoLayerLinear(4, init_std=1.0, seed=3)
    before = {name: p.detach().clone() for name, p in net.named_parameters()}
    first = lt.perturbation_increases(net, target[:4, :4], gamma=0.1, seeds=3)
    assert all(torch.equal(p, before[name]) for name, p in net.named_parameters())
    assert lt.perturbation_increases(net, target[:4, :4], gamma=0.1, seeds=3) == first
    assert len(set(first)) == 3  # three different draws


def test_gaussian_inflection_point_matches_proposition_4_3(run):
    """Perturbed loss L + E[ΔL] falls while 2dγ²·init_std² < σ_n and rises after (Springer et al., 2025, Prop. 4.3,
    Definition 4.2): with 2d·s² = 3.5 the inflection is at k = 5 (σ_6 = 3 < 3.5 < σ_5 = 4)."""
    target, trajectory = run
    s = (3.5 / (2 * len(lt.SINGULAR_VALUES))) ** 0.5
    net = lt.TwoLayerLinear(len(lt.SINGULAR_VALUES), lt.INIT_STD)
    perturbed = []
    for index in trajectory.checkpoints():
        with torch.no_grad():
            for name, p in net.named_parameters():
                p.copy_(trajectory.states[index][name])
        perturbed.append(trajectory.loss[index] + lt.expected_increase(net, s / lt.INIT_STD))
    rises = np.diff(perturbed) > 0
    assert rises.tolist() == [False] * 5 + [True] * 3, np.round(perturbed, 3)


def test_a_target_never_reached_is_one_clear_error():
    _, _, trajectory = lt.train([2.0, 1.0], steps=5, lr=1e-2, init_std=1e-6)
    with pytest.raises(ValueError, match="never reached half"):
        trajectory.half_times()
