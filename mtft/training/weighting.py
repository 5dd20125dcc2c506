"""Pluggable combination of the per-objective losses.

Each training step produces the vector of per-objective losses L = (L_1, ..., L_T) for the objectives present
in that step. A :class:`Weighting` turns it into simplex weights w, and the step back-propagates
Σ_t w_t L_t. A weighting that needs per-objective gradients (LF-MLF, MGDA, ...) declares
``needs_gram = True``: the training step then computes the Gram matrix G_ts = g_tᵀ g_s of the gradients of
the shared parameters *before* deciding w and before the engine's optimizer step (SPEC §1), and passes it in.
"""

from __future__ import annotations

from typing import Callable, ClassVar, Optional

import torch


class Weighting:
    """Base class: map per-objective losses (and optionally their gradients' Gram) to weights."""

    name: ClassVar[str]
    needs_gram: ClassVar[bool] = False
    step_class: ClassVar[Optional[type]] = None  # the training step that supplies the Gram, when needs_gram

    def __call__(self, losses: torch.Tensor, gram: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Return non-negative weights summing to one, one per entry of ``losses`` (present objectives)."""
        raise NotImplementedError

    def state(self) -> dict[str, float]:
        """Scalars to log for the last call (e.g. solver diagnostics)."""
        return {}


WEIGHTINGS: dict[str, Callable[[], Weighting]] = {}


def register_weighting(cls: type[Weighting]) -> type[Weighting]:
    WEIGHTINGS[cls.name] = cls
    return cls


@register_weighting
class MeanWeighting(Weighting):
    """Linear scalarisation with equal weights: the plain mean of the present objectives' losses."""

    name = "mean"

    def __call__(self, losses: torch.Tensor, gram: Optional[torch.Tensor] = None) -> torch.Tensor:
        return torch.full_like(losses, 1.0 / losses.numel())


def build_weighting(name: str) -> Weighting:
    return WEIGHTINGS[name]()
