"""The typed options of the adapter methods: the keys of ``model.adapter`` beside ``method``.

Each method owns one model (its ``Options``), as each weighting does: the config schema validates the section with
the chosen method's, ``run.py --help`` lists each method's, and a key of another method's is refused in one line
naming its owner (:meth:`mtft.core.registry.Registry.typed_options`). The built-in methods' models live here, apart
from the methods, so that validating a config or printing ``--help`` imports neither PEFT nor torch.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class AdapterOptions(BaseModel):
    """A method without options (full fine-tuning, head-only); the base of every method's ``Options``."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class LoraOptions(AdapterOptions):
    """A LoRA adapter's shape (Hu et al., 2021): rank, scaling, dropout and the layers it adapts."""

    r: int = Field(8, ge=1, description="LoRA rank.")
    alpha: float = Field(16.0, gt=0.0, description="LoRA alpha; the update is scaled by alpha / r.")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="LoRA dropout on the adapter's input.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["query", "value"],
        description="Layers to adapt, matched by PEFT's rules (a name suffix, e.g. query, value, dense).",
    )

    @property
    def scaling(self) -> float:
        return self.alpha / self.r


class MultiLoraOptions(LoraOptions):
    """Shared-A Multi-LoRA: one frozen random A (r × in) shared by every slot, one trained B (out × r) per slot.

    ``init_a``: ``"peft"`` draws A as PEFT does by default (Kaiming-uniform, a = √5) -- the default, because its
    scale (≈ 1/√in) keeps A·x at the scale of x so the B's train at ordinary learning rates; ``"gaussian"`` draws
    i.i.d. N(0, 1) as in the paper's Algorithm 1, which multiplies A·x by ≈ √in and needs a correspondingly smaller
    learning rate.
    """

    granularity: Literal["task", "objective"] = Field(
        "task",
        description="One B per task, or one B per loss objective (weighting.objectives); with objective, every "
        "evaluated (task, language) must be a training objective.",
    )
    init_a: Literal["peft", "gaussian"] = Field(
        "peft",
        description="Initialisation of the shared A: peft (PEFT's default, trains at usual learning rates) or "
        "gaussian (i.i.d. N(0,1), the paper's Algorithm 1).",
    )
