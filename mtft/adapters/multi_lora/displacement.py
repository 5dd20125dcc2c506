"""Where each Multi-LoRA adapter's model is relative to θ_p, every optimizer step, without a copy of the base model.

Theorem 1 (Mao et al., 2022) is about the weights L_p sees; under Adam the update applied is not η·d_k, so the
weights themselves are measured after every optimizer step. The effective weight of an adapted layer for slot i
is W0 + s·B_i·A, so θ_i − θ_p = s·B_i·A per layer: ||s·B_i·A||²_F = s²·⟨B_iᵀB_i, A·Aᵀ⟩ with r×r matrices (A is
frozen, A·Aᵀ computed once); the same for the step's ΔB_i. Each slot's adapter (a task's, or an objective's with
``granularity: objective``) is its own model θ_i, so every quantity is reported per slot.

The optional penalty λ·||θ_i − θ_p||² adds 2λ·s²·B_i·A·Aᵀ to the stacked B's gradient (every slot, every
micro-batch: the B's are one parameter), and the budget's "scale" action sets B_i ← B_i,k + α_i·ΔB_i, which
is exactly θ_i ← θ_i,k + α_i·Δθ_i as θ_i is linear in B_i.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import torch
from torch import nn

from mtft.adapters.multi_lora.layer import MultiLoraLinear


class MultiLoraDisplacement:
    def __init__(self, encoder: nn.Module, slot_names: Sequence[str], prefix: str = "encoder."):
        self.layers = [(prefix + n, m) for n, m in encoder.named_modules() if isinstance(m, MultiLoraLinear)]
        self.groups = list(slot_names)
        # Layers whose B's have one shape are measured together, in one batched product per shape and step: a
        # handful of ops instead of a few per layer (the per-op overhead was most of the monitors' per-step cost).
        shapes: dict[tuple[int, ...], list[int]] = {}
        for i, (_, m) in enumerate(self.layers):
            shapes.setdefault(tuple(m.lora_B.weight.shape), []).append(i)
        self.shape_groups = list(shapes.values())
        with torch.no_grad():
            self.gram_a = [(m.lora_A.double() @ m.lora_A.double().T) for _, m in self.layers]  # A·Aᵀ, r × r
            # s²·A·Aᵀ per layer of a shape group, (layers, 1, r, r)
            self.metric = [
                torch.stack([self.layers[i][1].scaling ** 2 * self.gram_a[i] for i in idx]).unsqueeze(1)
                for idx in self.shape_groups
            ]
            self.prev = self._stacked_b()

    def adapter(self, group: int) -> int:
        return group

    def _stacked_b(self) -> list[torch.Tensor]:
        """Per shape group, its layers' B's stacked, (layers, k, out, r), in float64."""
        return [
            torch.stack([self.layers[i][1].lora_B.weight.detach() for i in idx]).double() for idx in self.shape_groups
        ]

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
        deltas = {
            f"{name}.base_layer.weight": m.scaling * (m.lora_B.weight[group] @ m.lora_A) for name, m in self.layers
        }
        return [deltas[n].to(self.layers[0][1].base_layer.weight.dtype) for n in names]

    def hessian_subset(self) -> tuple[list[str], dict[str, torch.Tensor]]:
        """The base weights of the adapted layers (what the adapters move), at B = 0 (θ_p)."""
        names = [f"{name}.base_layer.weight" for name, _ in self.layers]
        zeros = {f"{name}.lora_B.weight": torch.zeros_like(m.lora_B.weight) for name, m in self.layers}
        return names, zeros

    def regularize(self, strength: float, accumulation: int) -> list:
        handles = []
        for i, (_, m) in enumerate(self.layers):
            factor = 2.0 * strength * m.scaling**2 / accumulation
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
