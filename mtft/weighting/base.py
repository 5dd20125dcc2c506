"""The weighting API: per-objective losses (and the Gram of their gradients) in, weights out.

Each training step produces, for the T objectives present in it, the losses L = (L_1 … L_T) and -- when the
weighting asks for it with ``needs_gram`` -- the T×T Gram matrix G_ts = g_tᵀ g_s of the objectives'
gradients with respect to the shared parameters. A :class:`Weighting` maps them to weights w, and the
update applied is the gradient of Σ_t w_t L_t (so a parameter private to one objective receives w_t times
its gradient). Everything is float64 NumPy: weightings are small dense linear algebra.
"""

from __future__ import annotations

from typing import Callable, ClassVar, Optional

import numpy as np


class Weighting:
    """Base class. Subclasses set ``name`` (the config value) and implement :meth:`__call__`."""

    name: ClassVar[str]
    needs_gram: ClassVar[bool] = False

    def __call__(self, losses: np.ndarray, gram: Optional[np.ndarray] = None) -> np.ndarray:
        """Weights (float64, shape (T,)) for the T present objectives: on the simplex for the min-norm
        methods; ≥ 0 for most others (IMTL-G may weight a conflicting objective negatively, as its paper does)."""
        raise NotImplementedError

    def state(self) -> dict[str, float]:
        """Scalars describing the last call, for the logs (e.g. a solver's certificate)."""
        return {}


WEIGHTINGS: dict[str, Callable[[], Weighting]] = {}


def register_weighting(cls: type[Weighting]) -> type[Weighting]:
    """Class decorator: make ``cls`` selectable as ``weighting.method: <cls.name>``."""
    WEIGHTINGS[cls.name] = cls
    return cls


@register_weighting
class MeanWeighting(Weighting):
    """Linear scalarisation with equal weights: the plain mean of the present objectives' losses."""

    name = "mean"

    def __call__(self, losses: np.ndarray, gram: Optional[np.ndarray] = None) -> np.ndarray:
        return np.full(len(losses), 1.0 / len(losses))


def weighting_class(name: str) -> type[Weighting]:
    """The class selected by ``weighting.method``; ValueError naming the valid choices."""
    if name not in WEIGHTINGS:
        raise ValueError(f"unknown weighting {name!r}; valid choices: {', '.join(sorted(WEIGHTINGS))}")
    return WEIGHTINGS[name]


def build_weighting(name: str, options: Optional[dict] = None) -> Weighting:
    return weighting_class(name)(**(options or {}))
