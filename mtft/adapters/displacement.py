"""Where the weights are relative to θ_p, from the *actual* updates Δθ_k = θ_{k+1} − θ_k, every step.

Theorem 1 is about the weights L_p sees. Under Adam the update applied is not η·d_k, so the trackers measure
the weights themselves after every optimizer step, over the parameters fine-tuning moves only:

- :class:`FullDisplacement` (full fine-tuning): the encoder's trainable tensors; it keeps θ_p and θ_k (two
  copies of them) and measures ||Δθ_k||² and ||θ − θ_p||² with fused ``torch._foreach`` kernels.
- :class:`LoraDisplacement` (Multi-LoRA): the effective weight of an adapted layer for task i is
  W0 + s·B_i·A, so θ_i − θ_p = s·B_i·A per layer and no copy of the base model is needed:
  ||s·B_i·A||²_F = s²·⟨B_iᵀB_i, A·Aᵀ⟩ with r×r matrices (A is frozen, A·Aᵀ computed once); the same for
  the step's ΔB_i. Each task adapter is its own model θ_i, so every quantity is reported per task.

Both also apply the optional penalty λ·||θ − θ_p||² (a gradient hook adding 2λ(θ − θ_p), or
2λ·s²·B_i·A·Aᵀ for Multi-LoRA) and the budget's "scale" action (θ ← θ_k + α·Δθ_k).
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import torch
from torch import nn

from mtft.adapters.multi_lora import MultiLoraLinear


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
        return [_sum_sq(torch._foreach_sub(self.params, self.prev))], \
            [_sum_sq(torch._foreach_sub(self.params, self.theta_p))]

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


class LoraDisplacement:
    def __init__(self, encoder: nn.Module, task_names: list[str], prefix: str = "encoder."):
        self.layers = [(prefix + n, m) for n, m in encoder.named_modules() if isinstance(m, MultiLoraLinear)]
        self.groups = list(task_names)
        # Layers whose B's have one shape are measured together, in one batched product per shape and step: a
        # handful of ops instead of a few per layer (the per-op overhead was most of the monitors' per-step cost).
        shapes: dict[tuple[int, ...], list[int]] = {}
        for i, (_, m) in enumerate(self.layers):
            shapes.setdefault(tuple(m.lora_B.weight.shape), []).append(i)
        self.shape_groups = list(shapes.values())
        with torch.no_grad():
            self.gram_a = [(m.lora_A.double() @ m.lora_A.double().T) for _, m in self.layers]  # A·Aᵀ, r × r
            # s²·A·Aᵀ per layer of a shape group, (layers, 1, r, r)
            self.metric = [torch.stack([self.layers[i][1].scaling ** 2 * self.gram_a[i] for i in idx]).unsqueeze(1)
                           for idx in self.shape_groups]
            self.prev = self._stacked_b()

    def adapter(self, group: int) -> int:
        return group

    def _stacked_b(self) -> list[torch.Tensor]:
        """Per shape group, its layers' B's stacked, (layers, k, out, r), in float64."""
        return [torch.stack([self.layers[i][1].lora_B.weight.detach() for i in idx]).double()
                for idx in self.shape_groups]

    def _sq(self, stacked: list[torch.Tensor]) -> torch.Tensor:
        """||s·B_i·A||² = s²·tr(B_iᵀB_i·A·Aᵀ) summed over the layers, for every task i."""
        return sum(((b.transpose(-1, -2) @ b) * metric).sum(dim=(0, 2, 3)) for b, metric in zip(stacked, self.metric))

    @torch.no_grad()
    def measure(self) -> tuple[list[float], list[float]]:
        current = self._stacked_b()
        update = self._sq([b - prev for b, prev in zip(current, self.prev)])
        return update.tolist(), self._sq(current).tolist()

    @torch.no_grad()
    def advance(self) -> None:
        self.prev = self._stacked_b()

    @torch.no_grad()
    def scale_update(self, alphas: Sequence[float]) -> None:
        weight = torch.tensor(alphas, dtype=torch.float64, device=self.prev[0].device).view(-1, 1, 1)
        for idx, prev in zip(self.shape_groups, self.prev):
            for i, before in zip(idx, prev):
                b = self.layers[i][1].lora_B.weight
                b.copy_(before + weight * (b.double() - before))

    def pretrained_point(self) -> dict[str, torch.Tensor]:
        return {f"{name}.base_layer.weight": m.base_layer.weight for name, m in self.layers}

    @torch.no_grad()
    def delta(self, group: int, names: list[str]) -> list[torch.Tensor]:
        """s·B_i·A per adapted layer: the effective weight change of task ``group`` (materialised only here)."""
        deltas = {f"{name}.base_layer.weight": m.scaling * (m.lora_B.weight[group] @ m.lora_A) for name, m in self.layers}
        return [deltas[n].to(self.layers[0][1].base_layer.weight.dtype) for n in names]

    def hessian_subset(self) -> tuple[list[str], dict[str, torch.Tensor]]:
        """The base weights of the adapted layers (what the adapters move), at B = 0 (θ_p)."""
        names = [f"{name}.base_layer.weight" for name, _ in self.layers]
        zeros = {f"{name}.lora_B.weight": torch.zeros_like(m.lora_B.weight) for name, m in self.layers}
        return names, zeros

    def regularize(self, strength: float, accumulation: int) -> list:
        handles = []
        for i, (_, m) in enumerate(self.layers):
            factor = 2.0 * strength * m.scaling ** 2 / accumulation
            gram = self.gram_a[i].to(m.lora_B.weight.dtype)

            def hook(grad, b=m.lora_B.weight, gram=gram, factor=factor):
                return grad + factor * (b.detach() @ gram).to(grad.dtype)

            handles.append(m.lora_B.weight.register_hook(hook))
        return handles

    @contextlib.contextmanager
    def at_pretrained(self) -> Iterator[None]:
        with torch.no_grad():
            current = [m.lora_B.weight.detach().clone() for _, m in self.layers]
            for _, m in self.layers:
                m.lora_B.weight.zero_()
        try:
            yield
        finally:
            with torch.no_grad():
                for (_, m), saved in zip(self.layers, current):
                    m.lora_B.weight.copy_(saved)


def _sum_sq(tensors: list[torch.Tensor]) -> float:
    if not tensors:
        return 0.0
    norms = torch._foreach_norm(tensors)
    return float(torch.stack(norms).double().pow(2).sum())
