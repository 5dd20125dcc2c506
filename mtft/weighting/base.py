"""The weighting API: per-objective losses (and the Gram of their gradients) in, weights out.

Each training step produces, for the T objectives present in it, the losses L = (L_1 … L_T) and -- when the
weighting asks for it with ``needs_gram`` -- the T×T Gram matrix G_ts = g_tᵀ g_s of the objectives'
gradients with respect to the shared parameters. A :class:`Weighting` maps them to weights w, and the
update applied is the gradient of Σ_t w_t L_t (so a parameter private to one objective receives w_t times
its gradient). Everything is float64 NumPy: weightings are small dense linear algebra.

The base class owns what every method would otherwise repeat (the prologue of TorchJD's aggregators, Quinton &
Rey 2024): the inputs are validated once, here, so that a method's :meth:`Weighting.weigh` starts from a 1-D
float64 loss vector and, for Gram methods, a finite symmetric float64 Gram of the matching size.
"""

from __future__ import annotations

from typing import ClassVar, Optional

import numpy as np
from pydantic import BaseModel, ConfigDict

from mtft.pareto import SolverInputError, check_gram

# A gradient whose norm is below this fraction of the largest one is treated as zero (it carries no
# direction that normalisation could recover: only round-off).
ZERO_NORM = 1e-12
# The largest |G_ts − G_st| accepted, relative to max |G|. A Gram formed in float32 may sum its two triangles
# in different orders (blocked or split-K matrix products), which leaves differences of ~1e-7 relative, and up
# to ~1e-5 over very long gradients; a matrix that is not a Gram at all is asymmetric at O(1). Below this the
# two triangles are averaged (:func:`mtft.pareto.check_gram`), above it the input is refused.
ASYMMETRY_TOL = 1e-3


class WeightingOptions(BaseModel):
    """A weighting's ``weighting.options``, typed: validated with the run config (an unknown or ill-typed option is
    one error line naming it and the valid ones) and listed by ``run.py --help``. A weighting's own model subclasses
    this with one field per keyword argument of its constructor (default and description included)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Weighting:
    """Base class: ``weighting(losses, gram) -> weights``, float64 of shape (T,).

    Subclasses implement :meth:`weigh`; :meth:`__call__` validates the inputs first. Class attributes:

    - ``name``: the value of ``weighting.method`` that selects a registered method
      (:func:`mtft.weighting.register_weighting`); a class loaded as ``module:Class`` needs none.
    - ``needs_gram``: the training step computes the Gram of the per-objective gradients only for methods that
      set it (it costs a pass over T × shared parameters); :meth:`weigh` then always receives one.
    - ``single_objective_shortcut``: with T = 1 every method reduces to plain gradient descent, so the base
      answers [1.0] without calling :meth:`weigh` (``state()`` keeps the previous call's values). A method
      whose state must follow every call (LF-MLF's certificate and warm start) sets False and returns [1.0]
      from :meth:`weigh` itself.
    - ``Options``: the typed model of its constructor's keyword arguments (:class:`WeightingOptions`; the built-ins
      all have one). A class of one's own without it gets ``weighting.options`` as keyword arguments unchecked
      until it is constructed (at load time all the same).

    ``state()`` reports scalars of the last call for the logs: methods store them in ``self._state``.
    """

    name: ClassVar[str]
    Options: ClassVar[Optional[type[WeightingOptions]]] = None
    needs_gram: ClassVar[bool] = False
    single_objective_shortcut: ClassVar[bool] = True

    def __init__(self) -> None:
        self._state: dict[str, float] = {}

    def __call__(self, losses: np.ndarray, gram: Optional[np.ndarray] = None) -> np.ndarray:
        """Weights (float64, shape (T,)) for the T present objectives: on the simplex for the min-norm
        methods; ≥ 0 for most others (IMTL-G may weight a conflicting objective negatively, as its paper does)."""
        losses = check_losses(losses)
        g = check_objective_gram(gram, len(losses)) if self.needs_gram else None
        if len(losses) == 1 and self.single_objective_shortcut:
            return np.ones(1)
        return self.weigh(losses, g)

    def weigh(self, losses: np.ndarray, gram: Optional[np.ndarray]) -> np.ndarray:
        """The method itself, on validated inputs: ``gram`` is the checked Gram when ``needs_gram``, else None."""
        raise NotImplementedError(f"{type(self).__name__} does not implement weigh(losses, gram)")

    def state(self) -> dict[str, float]:
        """Scalars describing the last call, for the logs (e.g. a solver's certificate); a copy."""
        return dict(getattr(self, "_state", {}))


def check_losses(losses: np.ndarray) -> np.ndarray:
    """The losses as a non-empty 1-D float64 array (their values may be anything, NaN included: most methods
    look only at how many there are)."""
    out = np.asarray(losses, dtype=np.float64)
    if out.ndim != 1:
        raise ValueError(f"losses must be a 1-D array (one per objective), got shape {out.shape}")
    if len(out) == 0:
        raise ValueError("there are no losses (T = 0): there is no objective to weight")
    return out


def check_objective_gram(gram: Optional[np.ndarray], num_losses: int) -> np.ndarray:
    """Validated symmetric float64 Gram whose size matches the losses.

    Raises ValueError when it is missing or of the wrong size, and :class:`mtft.pareto.SolverInputError` (a
    ValueError, which the training step answers by skipping the step) when it is not a usable Gram: NaN/inf,
    not square, a negative diagonal, or asymmetric beyond round-off (see :data:`ASYMMETRY_TOL`).
    """
    if gram is None:
        raise ValueError("this weighting needs the Gram of the objectives' gradients (needs_gram = True)")
    g = check_gram(gram)
    if g.shape[0] != num_losses:
        raise ValueError(f"gram is {g.shape[0]}×{g.shape[0]} but there are {num_losses} losses")
    raw = np.asarray(gram, dtype=np.float64)
    gap = np.abs(raw - raw.T)
    if gap.max() > ASYMMETRY_TOL * np.abs(raw).max():
        i, j = (int(k) for k in np.unravel_index(int(gap.argmax()), gap.shape))
        raise SolverInputError(
            f"gram is not symmetric: G[{i},{j}] = {raw[i, j]} but G[{j},{i}] = {raw[j, i]} (a Gram g_tᵀg_s is "
            f"symmetric up to round-off, here taken as {ASYMMETRY_TOL:g} of max |G|)"
        )
    return g


def gradient_norms(gram: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(||g_t||, mask of the non-zero gradients) from the Gram's diagonal; see :data:`ZERO_NORM`."""
    n = np.sqrt(np.clip(np.diag(gram), 0.0, None))
    return n, n > ZERO_NORM * n.max() if n.max() > 0 else np.zeros(len(n), bool)
