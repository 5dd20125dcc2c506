"""L2-SP (Li, Grandvalet & Davoine, 2018: Ω(w) = (α/2)||w_S − w_S⁰||²) is the full method's pull towards θ_p,
``forgetting.regularization`` λ·||θ − θ_p||² (see docs/stability.md): its gradient is literally 2λ(θ − θ_p), on
the encoder's trainable weights only."""

from __future__ import annotations

import torch
from torch import nn

from mtft.adapters.full.displacement import FullDisplacement


def test_l2sp_gradient_is_two_lambda_times_the_displacement():
    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)).double()
    encoder[0].bias.requires_grad_(False)  # a frozen tensor is not pulled
    tracker = FullDisplacement(encoder)
    theta_p = [p.detach().clone() for p in encoder.parameters() if p.requires_grad]
    with torch.no_grad():
        for p in encoder.parameters():
            p.add_(torch.randn_like(p))
    lam = 0.35
    handles = tracker.regularize(lam, accumulation=1)
    inputs = torch.randn(6, 5, dtype=torch.float64)
    loss = encoder(inputs).pow(2).sum()
    trainable = [p for p in encoder.parameters() if p.requires_grad]
    with_penalty = torch.autograd.grad(loss, trainable)
    for handle in handles:
        handle.remove()
    task_only = torch.autograd.grad(encoder(inputs).pow(2).sum(), trainable)
    for got, task, param, anchor in zip(with_penalty, task_only, trainable, theta_p):
        assert torch.allclose(got - task, 2 * lam * (param.detach() - anchor), rtol=1e-10, atol=1e-12)
    assert len(tracker.params) == len(trainable) == 3
