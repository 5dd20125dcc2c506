"""Where fully fine-tuned weights are relative to θ_p, from the *actual* updates Δθ_k = θ_{k+1} − θ_k.

Theorem 1 (Mao et al., 2022) is about the weights L_p sees. Under Adam the update applied is not η·d_k, so the
tracker measures the weights themselves after every optimizer step, over the encoder's trainable tensors: it
keeps θ_p and θ_k (two copies of them) and measures ||Δθ_k||² and ||θ − θ_p||² with fused ``torch._foreach``
kernels. It also applies the optional penalty λ·||θ − θ_p||² (a gradient hook adding 2λ(θ − θ_p)) and the
budget's "scale" action (θ ← θ_k + α·Δθ_k).
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import torch
from torch import nn


class FullDisplacement:
    groups: list[str]

    def __init__(self, encoder: nn.Module, prefix: str = "encoder."):
        self.named = [(prefix + n, p) for n, p in encoder.named_parameters() if p.requires_grad]
        self.params = [p for _, p in self.named]
        self.names = [n for n, _ in self.named]
        with torch.no_grad():
            self.theta_p = [p.detach().clone() for p in self.params]
            self.prev = [p.detach().clone() for p in self.params]
        self.groups = [""]

    def adapter(self, group: int) -> int:
        return 0

    @torch.no_grad()
    def measure(self) -> tuple[list[float], list[float]]:
        """(||θ_{k+1} − θ_k||², ||θ_{k+1} − θ_p||²) per group; θ_k is *not* advanced (see :meth:`advance`)."""
        return [_sum_sq(torch._foreach_sub(self.params, self.prev))], [
            _sum_sq(torch._foreach_sub(self.params, self.theta_p))
        ]

    @torch.no_grad()
    def advance(self) -> None:
        torch._foreach_copy_(self.prev, self.params)

    @torch.no_grad()
    def scale_update(self, alphas: Sequence[float]) -> None:
        """θ ← θ_k + α·(θ − θ_k)."""
        torch._foreach_lerp_(self.params, self.prev, 1.0 - alphas[0])

    def pretrained_point(self) -> dict[str, torch.Tensor]:
        return dict(zip(self.names, self.theta_p))

    @torch.no_grad()
    def delta(self, group: int, names: list[str]) -> list[torch.Tensor]:
        """θ − θ_p on the parameters ``names`` of the Hessian subset."""
        index = {n: i for i, n in enumerate(self.names)}
        return [self.params[index[n]] - self.theta_p[index[n]] for n in names]

    def hessian_subset(self) -> tuple[list[str], dict[str, torch.Tensor]]:
        """The parameters λ_p is taken over (those fine-tuning moves) and fixed overrides for θ_p."""
        return list(self.names), {}

    def regularize(self, strength: float, accumulation: int) -> list:
        scale = 2.0 * strength / accumulation  # the engine calls backward once per micro-batch

        def hook(param, anchor):
            return lambda grad: grad + scale * (param.detach() - anchor).to(grad.dtype)

        return [p.register_hook(hook(p, a)) for p, a in zip(self.params, self.theta_p)]

    @contextlib.contextmanager
    def at_pretrained(self) -> Iterator[None]:
        """The encoder holds θ_p inside the block, exactly its current weights after it."""
        with torch.no_grad():
            current = [p.detach().clone() for p in self.params]
            torch._foreach_copy_(self.params, self.theta_p)
        try:
            yield
        finally:
            with torch.no_grad():
                torch._foreach_copy_(self.params, current)


def _sum_sq(tensors: list[torch.Tensor]) -> float:
    if not tensors:
        return 0.0
    norms = torch._foreach_norm(tensors)
    return float(torch.stack(norms).double().pow(2).sum())
