"""The theory check of Springer et al. (2025, Section 4): a two-layer linear network θ = W1·W2 trained by small-step
gradient descent on y = A_pre·x learns A_pre's singular values one after another, each along a sigmoid (Saxe et al.,
2018, eq. 7; Springer et al., 2025, Theorem 4.1), and the loss increase caused by a fixed Gaussian perturbation of
(W1, W2) grows with the number of singular values learnt -- progressive sensitivity (Springer et al., 2025,
Proposition 4.3 / Lemma A.4: each newly learnt σ_n adds about 2dγ²σ_n to the expected increase).

The pre-training loss is the population loss over x ~ N(0, I): E‖W1W2x − A_pre x‖² = ‖W1W2 − A_pre‖²_F (Springer et
al., 2025, Section 4.1), computed exactly rather than on a sample. The perturbation is the product's own Gaussian
probe (:func:`mtft.forgetting.probe.gaussian_probe`, Springer et al., 2025, eq. 1): noise std = γ × each weight's
initialisation std, the same draw for every checkpoint, the weights restored bit-identically afterwards.

``python -m mtft.forgetting.linear_theory`` prints the half-times and the ΔL-per-k table quoted in
docs/overtraining.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import curve_fit
from torch import nn

from mtft.forgetting.probe import gaussian_probe


def target_matrix(singular_values: list[float], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A_pre = U·diag(σ)·Vᵀ with random orthogonal U, V (QR of Gaussian matrices); returns (A_pre, U, V), float64."""
    generator = torch.Generator().manual_seed(seed)
    d = len(singular_values)
    u, _ = torch.linalg.qr(torch.randn(d, d, generator=generator, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(d, d, generator=generator, dtype=torch.float64))
    sigma = torch.tensor(singular_values, dtype=torch.float64)
    return u @ torch.diag(sigma) @ v.T, u, v


class TwoLayerLinear(nn.Module):
    """x ↦ W1·W2·x as two bias-free ``nn.Linear`` layers (``first`` holds W2, ``second`` holds W1), every weight entry
    drawn from N(0, init_std²) -- the small initialisation the incremental-learning theory assumes."""

    def __init__(self, dim: int, init_std: float, seed: int = 0):
        super().__init__()
        self.init_std = init_std
        self.first = nn.Linear(dim, dim, bias=False, dtype=torch.float64)
        self.second = nn.Linear(dim, dim, bias=False, dtype=torch.float64)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for layer in (self.first, self.second):
                layer.weight.copy_(torch.randn(dim, dim, generator=generator, dtype=torch.float64) * init_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x))

    def product(self) -> torch.Tensor:
        """θ = W1·W2 (so that forward(x) = x·θᵀ for a batch of rows x)."""
        return self.second.weight @ self.first.weight


def population_loss(net: TwoLayerLinear, target: torch.Tensor) -> torch.Tensor:
    """E_{x~N(0,I)}‖θx − A_pre x‖² = ‖θ − A_pre‖²_F."""
    return (net.product() - target).pow(2).sum()


@dataclass
class Trajectory:
    """Per recorded step: the step index, the loss, and u_iᵀ·θ·v_i for every singular direction of A_pre."""

    steps: np.ndarray  # (T,)
    loss: np.ndarray  # (T,)
    projected: np.ndarray  # (T, d)
    target: np.ndarray  # (d,) the singular values of A_pre
    states: list[dict[str, torch.Tensor]]  # the weights at every recorded step

    def half_times(self) -> np.ndarray:
        """Per singular value: the first recorded step at which u_iᵀθv_i reaches half of σ_i."""
        reached = self.projected >= 0.5 * self.target
        if not reached.any(axis=0).all():
            missing = np.flatnonzero(~reached.any(axis=0)).tolist()
            raise ValueError(f"singular values {missing} never reached half their target; train longer")
        return self.steps[reached.argmax(axis=0)]

    def checkpoints(self) -> list[int]:
        """Indices into the record for k = 0, 1, …, d learnt singular values: k = 0 is the initialisation, k = d the
        end, and 0 < k < d the step midway between the half-times of σ_k and σ_{k+1} (the plateau where θ ≈
        U·Σ_{:k}·Vᵀ, Springer et al., 2025, Theorem 4.1)."""
        half = self.half_times()
        marks = [0]
        for k in range(1, len(half)):
            marks.append(int(np.searchsorted(self.steps, (half[k - 1] + half[k]) / 2)))
        marks.append(len(self.steps) - 1)
        return marks


def train(
    singular_values: list[float],
    steps: int,
    lr: float,
    init_std: float = 1e-3,
    seed: int = 0,
    record_every: int = 1,
) -> tuple[TwoLayerLinear, torch.Tensor, Trajectory]:
    """Gradient descent (``torch.optim.SGD``, a small step standing in for the paper's gradient flow) on the
    population loss; records the loss and the projected singular values every ``record_every`` steps."""
    target, u, v = target_matrix(singular_values, seed)
    net = TwoLayerLinear(len(singular_values), init_std, seed + 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr)
    record_steps, losses, projected, states = [], [], [], []
    for step in range(steps + 1):
        loss = population_loss(net, target)
        if step % record_every == 0 or step == steps:
            with torch.no_grad():
                record_steps.append(step)
                losses.append(float(loss))
                projected.append(torch.diagonal(u.T @ net.product() @ v).numpy().copy())
                states.append({name: p.detach().clone() for name, p in net.named_parameters()})
        if step == steps:
            break
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    trajectory = Trajectory(
        np.array(record_steps), np.array(losses), np.stack(projected), np.array(singular_values, dtype=float), states
    )
    return net, target, trajectory


def logistic(t: np.ndarray, height: float, rate: float, midpoint: float) -> np.ndarray:
    return height / (1.0 + np.exp(-rate * (t - midpoint)))


def fit_logistic(steps: np.ndarray, values: np.ndarray, height: float) -> tuple[np.ndarray, float]:
    """Least-squares logistic fit (scipy's ``curve_fit``) of one singular value's rise; returns the parameters
    (height, rate, midpoint) and the largest absolute residual relative to ``height``."""
    start = (height, 4.0 / max(float(np.ptp(steps)), 1.0), float(steps[np.argmax(values >= height / 2)]))
    params, _ = curve_fit(logistic, steps, values, p0=start, maxfev=10_000)
    residual = float(np.max(np.abs(logistic(steps, *params) - values))) / height
    return params, residual


def perturbation_increases(net: TwoLayerLinear, target: torch.Tensor, gamma: float, seeds: int) -> list[float]:
    """ΔL = L(θ̃) − L(θ) for each of the probe's ``seeds`` noise draws (γ in units of the initialisation std). A draw
    depends only on its seed and the weights' shapes, so every checkpoint is perturbed by the same draws."""
    stds = {name: net.init_std for name, _ in net.named_parameters()}
    evaluate = lambda: {"pre": float(population_loss(net, target))}  # noqa: E731
    result = gaussian_probe(net, stds, evaluate, [gamma], seeds, "linear")
    return [trial["lp"]["pre"] - result.baseline["pre"] for trial in result.trials]


def expected_increase(net: TwoLayerLinear, gamma: float) -> float:
    """E[ΔL] in closed form for Z1, Z2 with i.i.d. N(0, s²) entries, s = γ·init_std: the cross terms have mean zero,
    so E‖(W1+Z1)(W2+Z2) − A‖² − ‖W1W2 − A‖² = d·s²·(‖W1‖²_F + ‖W2‖²_F) + d³·s⁴ (Springer et al., 2025, Lemma A.5
    applied term by term)."""
    s = gamma * net.init_std
    d = net.first.weight.shape[0]
    with torch.no_grad():
        norms = float(net.first.weight.pow(2).sum() + net.second.weight.pow(2).sum())
    return d * s**2 * norms + d**3 * s**4


def sensitivity_by_learnt(
    trajectory: Trajectory, target: torch.Tensor, init_std: float, gamma: float, seeds: int
) -> list[dict]:
    """Per k = 0…d learnt singular values: the step, the loss, ΔL under each of the same ``seeds`` draws, their
    mean, and the closed-form expectation."""
    net = TwoLayerLinear(len(trajectory.target), init_std)
    rows = []
    for k, index in enumerate(trajectory.checkpoints()):
        with torch.no_grad():
            for name, p in net.named_parameters():
                p.copy_(trajectory.states[index][name])
        draws = perturbation_increases(net, target, gamma, seeds)
        rows.append(
            {
                "learnt": k,
                "step": int(trajectory.steps[index]),
                "loss": float(trajectory.loss[index]),
                "delta_loss": draws,
                "delta_loss_mean": float(np.mean(draws)),
                "delta_loss_expected": expected_increase(net, gamma),
            }
        )
    return rows


# The setting docs/overtraining.md quotes (its output in docs/results.md) and
# tests/unit/forgetting/test_linear_theory.py checks: σ = 8, 7, …, 1, init std 1e-6 (plateaus well separated),
# lr 1e-2 (well under the 2/(4σ_1) stability limit), noise std γ·init_std = 0.1 per entry, 32 probe seeds.
SINGULAR_VALUES = [8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0]
INIT_STD = 1e-6
LR = 1e-2
STEPS = 1200
GAMMA = 1e5
SEEDS = 32


def main() -> None:
    torch.set_num_threads(1)
    _, target, trajectory = train(SINGULAR_VALUES, STEPS, LR, INIT_STD)
    print(
        f"σ = {SINGULAR_VALUES}, init std {INIT_STD:g}, lr {LR:g}, {STEPS} steps, "
        f"γ = {GAMMA:g} × init std (noise std {GAMMA * INIT_STD:g}), {SEEDS} probe seeds"
    )
    print("step at which u_iᵀθv_i reaches σ_i/2:")
    print(", ".join(f"σ={s:g}: {h}" for s, h in zip(SINGULAR_VALUES, trajectory.half_times())))
    residuals = [
        fit_logistic(trajectory.steps.astype(float), c, s)[1] for s, c in zip(SINGULAR_VALUES, trajectory.projected.T)
    ]
    print("logistic fit, max |residual| / σ_i:", ", ".join(f"{r:.4f}" for r in residuals))
    print("\n| k learnt | step | L_pre | ΔL mean over the seeds (± s.e.) | E[ΔL] closed form | ΔL, draw 0 |")
    print("|---|---|---|---|---|---|")
    for row in sensitivity_by_learnt(trajectory, target, INIT_STD, GAMMA, SEEDS):
        error = float(np.std(row["delta_loss"], ddof=1) / np.sqrt(len(row["delta_loss"])))
        print(
            f"| {row['learnt']} | {row['step']} | {row['loss']:.3f} | {row['delta_loss_mean']:.3f} ± {error:.3f} "
            f"| {row['delta_loss_expected']:.3f} | {row['delta_loss'][0]:.3f} |"
        )


if __name__ == "__main__":
    main()
