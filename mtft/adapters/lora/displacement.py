"""Where each task's PEFT LoRA model is relative to θ_p, every optimizer step, without a copy of the base model.

Task i's effective weight in an adapted layer is W0 + s·B_i·A_i (s = alpha / r), so θ_i − θ_p = s·B_i·A_i per
layer -- PEFT starts every B at zero, where θ_i = θ_p. Both A_i and B_i train, and Frobenius inner products of
such products need only r × r matrices:

    ⟨B·A, B'·A'⟩ = Σ (BᵀB') ⊙ (A·A'ᵀ)

so ||θ_i − θ_p||² = s²·⟨B_i·A_i, B_i·A_i⟩, and the step's update B_i·A_i − B⁰_i·A⁰_i = ΔB·A + B⁰·ΔA (the
superscript 0 for the weights before the step) has ||·||² = ⟨ΔB·A, ΔB·A⟩ + 2⟨ΔB·A, B⁰·ΔA⟩ + ⟨B⁰·ΔA, B⁰·ΔA⟩,
free of the cancellation of a difference of two large norms. Layers of one shape are measured together, in one
batched product per shape. Each task's adapter is its own model, so every quantity is reported per task, and
:class:`~mtft.forgetting.mlm.MaskedLM` measures task i by routing every row to adapter i.

The penalty λ·Σ_i ||s·B_i·A_i||² adds 2λs²·B_i·A_i·A_iᵀ to B_i's gradient and 2λs²·B_iᵀ·B_i·A_i to A_i's. PEFT runs
only the adapters of the rows present, so an adapter without rows in a micro-batch gets no gradient at all,
penalty included: it is pulled back on the micro-batches that train it. The budget's "scale" action interpolates
A_i and B_i between the step's start and end (θ ← θ_k + α·Δθ_k on the trained weights); the effective weight is
bilinear in them, so the bound lands on the budget up to the second-order term α²·s·ΔB·ΔA.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Iterator, Sequence

import torch
from torch import nn

from mtft.adapters.lora.model import named_lora_layers
from mtft.core.errors import ConfigError

if TYPE_CHECKING:
    from peft.tuners.lora import LoraLayer


def frobenius_inner(b1: torch.Tensor, a1: torch.Tensor, b2: torch.Tensor, a2: torch.Tensor) -> torch.Tensor:
    """⟨B1·A1, B2·A2⟩ over the last two dimensions (B: out × r, A: r × in), from r × r products only."""
    return ((b1.transpose(-1, -2) @ b2) * (a1 @ a2.transpose(-1, -2))).sum(dim=(-2, -1))


class PeftLoraDisplacement:
    def __init__(self, encoder: nn.Module, task_names: Sequence[str], prefix: str = "encoder."):
        self.groups = list(task_names)
        self.layers = [(prefix + n, m) for n, m in named_lora_layers(encoder)]
        for name, m in self.layers:
            if any(task not in m.lora_A for task in self.groups):
                raise ConfigError(
                    f"forgetting monitors follow PEFT LoRA on linear layers; {name} ({type(m).__name__}) "
                    "is not one: adapt linear layers only, or set forgetting.enabled=false"
                )
        shapes: dict[tuple, list[int]] = {}
        for i, (_, m) in enumerate(self.layers):
            task = self.groups[0]
            shapes.setdefault((*m.lora_A[task].weight.shape, *m.lora_B[task].weight.shape), []).append(i)
        self.shape_groups = list(shapes.values())
        with torch.no_grad():
            # s² per (layer, task) of a shape group, (layers, tasks)
            self.scaling_sq = [
                torch.tensor(
                    [[self.layers[i][1].scaling[t] ** 2 for t in self.groups] for i in idx],
                    dtype=torch.float64,
                    device=self._device(),
                )
                for idx in self.shape_groups
            ]
            self.prev = self._stacked()

    def _device(self) -> torch.device:
        return self.layers[0][1].base_layer.weight.device if self.layers else torch.device("cpu")

    def _pairs(self, m: LoraLayer) -> list[tuple[nn.Parameter, nn.Parameter]]:
        return [(m.lora_A[t].weight, m.lora_B[t].weight) for t in self.groups]

    def adapter(self, group: int) -> int:
        return group

    def _stacked(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per shape group, its layers' A's (layers, tasks, r, in) and B's (layers, tasks, out, r), in float64."""
        stacked = []
        for idx in self.shape_groups:
            pairs = [self._pairs(self.layers[i][1]) for i in idx]
            a = torch.stack([torch.stack([a.detach() for a, _ in layer]) for layer in pairs]).double()
            b = torch.stack([torch.stack([b.detach() for _, b in layer]) for layer in pairs]).double()
            stacked.append((a, b))
        return stacked

    @torch.no_grad()
    def measure(self) -> tuple[list[float], list[float]]:
        update = torch.zeros(len(self.groups), dtype=torch.float64, device=self._device())
        distance = torch.zeros_like(update)
        for (a, b), (a0, b0), s2 in zip(self._stacked(), self.prev, self.scaling_sq):
            da, db = a - a0, b - b0
            distance += (s2 * frobenius_inner(b, a, b, a)).sum(dim=0)
            step = frobenius_inner(db, a, db, a) + 2 * frobenius_inner(db, a, b0, da) + frobenius_inner(b0, da, b0, da)
            update += (s2 * step).sum(dim=0)
        return update.tolist(), distance.tolist()

    @torch.no_grad()
    def advance(self) -> None:
        self.prev = self._stacked()

    @torch.no_grad()
    def scale_update(self, alphas: Sequence[float]) -> None:
        """A_i, B_i ← their values before the step + α_i·(the step's change), task by task."""
        for idx, (a0, b0) in zip(self.shape_groups, self.prev):
            for position, i in enumerate(idx):
                for t, (a, b) in enumerate(self._pairs(self.layers[i][1])):
                    if alphas[t] == 1.0:
                        continue
                    for param, before in ((a, a0[position, t]), (b, b0[position, t])):
                        param.copy_(before + alphas[t] * (param.double() - before))

    def pretrained_point(self) -> dict[str, torch.Tensor]:
        return {f"{name}.base_layer.weight": m.base_layer.weight for name, m in self.layers}

    @torch.no_grad()
    def delta(self, group: int, names: list[str]) -> list[torch.Tensor]:
        """s·B_i·A_i per adapted layer: the effective weight change of task ``group`` (materialised only here)."""
        task = self.groups[group]
        deltas = {
            f"{name}.base_layer.weight": (m.scaling[task] * (m.lora_B[task].weight @ m.lora_A[task].weight)).to(
                m.base_layer.weight.dtype
            )
            for name, m in self.layers
        }
        return [deltas[n] for n in names]

    def hessian_subset(self) -> tuple[list[str], dict[str, torch.Tensor]]:
        """The base weights of the adapted layers (what the adapters move), at every B = 0 (θ_p)."""
        names = [f"{name}.base_layer.weight" for name, _ in self.layers]
        zeros = {
            f"{name}.lora_B.{t}.weight": torch.zeros_like(m.lora_B[t].weight)
            for name, m in self.layers
            for t in self.groups
        }
        return names, zeros

    def regularize(self, strength: float, accumulation: int) -> list:
        handles = []
        for _, m in self.layers:
            for t, (a, b) in zip(self.groups, self._pairs(m)):
                factor = 2.0 * strength * m.scaling[t] ** 2 / accumulation  # one backward per micro-batch

                def on_b(grad, a=a, b=b, factor=factor):
                    a_ = a.detach()
                    return grad + factor * (b.detach() @ (a_ @ a_.T)).to(grad.dtype)

                def on_a(grad, a=a, b=b, factor=factor):
                    b_ = b.detach()
                    return grad + factor * ((b_.T @ b_) @ a.detach()).to(grad.dtype)

                handles += [b.register_hook(on_b), a.register_hook(on_a)]
        return handles

    @contextlib.contextmanager
    def at_pretrained(self) -> Iterator[None]:
        bs = [b for _, m in self.layers for _, b in self._pairs(m)]
        with torch.no_grad():
            current = [b.detach().clone() for b in bs]
            for b in bs:
                b.zero_()
        try:
            yield
        finally:
            with torch.no_grad():
                for b, saved in zip(bs, current):
                    b.copy_(saved)
