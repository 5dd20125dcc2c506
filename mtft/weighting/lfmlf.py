"""LF-MLF: the Pareto min-norm weights of the objectives' gradients (Mao et al., NeurIPS 2022)."""

from __future__ import annotations

import importlib.util
from typing import ClassVar, Literal, Optional

import numpy as np
from pydantic import Field, field_validator

from mtft.pareto import Certificate, SolverInputError, check_floor, solve_min_norm
from mtft.weighting.base import Weighting, WeightingOptions, gradient_norms

# Sener & Koltun (2018)'s gradient normalisers, as in their released code (``gradient_normalizers`` in
# MultiObjectiveOptimization/multi_task/min_norm_solvers.py): g_t is divided by c_t before the min-norm solve.
NORMALIZERS = ("none", "l2", "loss", "loss+")


class MinNormOptions(WeightingOptions):
    solver: Literal["exact", "cvxpy"] = Field(
        "exact",
        description="Min-norm solver: exact (active set over the simplex) or cvxpy (for comparison; the cvxpy "
        "extra: pip install 'mtft[cvxpy]').",
    )
    floor: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="The collapse guard β: every weight is kept ≥ β/T (0: the paper's min-norm weights; 1: the mean).",
    )

    @field_validator("solver")
    @classmethod
    def _cvxpy_installed(cls, solver: str) -> str:
        # the reference solver is optional: say what to install when the config is read, not at the first step
        if solver == "cvxpy" and importlib.util.find_spec("cvxpy") is None:
            raise ValueError("solver 'cvxpy' needs the cvxpy package: pip install 'mtft[cvxpy]' (or solver: exact)")
        return solver


class LFMLFOptions(MinNormOptions):
    normalize: Literal["none", "l2", "loss", "loss+"] = Field(
        "none",
        description="Sener & Koltun (2018)'s gradient normalisation before the min-norm solve: g_t/||g_t|| (l2), "
        "g_t/L_t (loss) or g_t/(L_t ||g_t||) (loss+).",
    )


class LFMLF(Weighting):
    """LF-MLF ("Less-forgetting multi-lingual fine-tuning", Mao et al., NeurIPS 2022): the Pareto min-norm weights.

    w* = argmin_{w ∈ Δ} ||Σ_t w_t g_t||² -- by Theorem 1 the forgetting of pre-training knowledge is bounded by
    the norms of the descent directions, and d = Σ w*_t g_t is the shortest direction that decreases every
    objective (Theorem 2: dᵀg_t ≥ ||d||²). ``state()`` holds the solver's certificate plus ``d_norm_sq``
    (= ||d||²), ``stationarity`` (= ||d||² / mean_t ||g_t||², the Pareto-stationarity measure of Theorem 3) and
    ``min_d_dot_g`` (= min_t dᵀg_t of the direction applied). The previous solution warm-starts the next call
    when T is unchanged; T = 1 goes through the solver too (``single_objective_shortcut = False``), so that
    the certificate and the warm start describe every call.

    Options (``weighting.options``):

    - ``floor`` = β ∈ [0, 1], the collapse guard: the weights are restricted to the floored simplex
      Δ_β = {Σw = 1, w_t ≥ β/T}. β = 0 is LF-MLF exactly; β = 1 is the mean. ||d|| stays ≤ ||ḡ|| (the mean
      gradient's norm) and is non-decreasing in β, but for β > 0 Theorem 2 no longer holds: ``min_d_dot_g``
      may be negative.
    - ``normalize``: Sener & Koltun (2018)'s gradient normalisation before the solve, for comparison --
      ``none``; ``l2``: g_t/||g_t||; ``loss``: g_t/L_t; ``loss+``: g_t/(L_t ||g_t||). The min-norm weights v of
      the normalised gradients u_t = g_t/c_t define the direction Σ v_t u_t = Σ (v_t/c_t) g_t, so the weights
      are v_t/c_t rescaled to sum to 1 (as ``mgda_normalized``, which is ``normalize=l2``). Objectives whose
      c_t is 0 (a zero gradient, or a zero loss) get weight 0; a negative or non-finite loss is refused with
      ``SolverInputError`` (the training step is skipped). The certificate then describes the normalised
      problem (its objective and gaps are in its units); ``d_norm_sq``, ``stationarity`` and ``min_d_dot_g``
      describe the direction applied. Normalised weights do not keep ||d|| ≤ ||ḡ||. With both options, the
      floor applies to v, the weights of the normalised gradients.
    """

    name = "lfmlf"
    Options: ClassVar[type[WeightingOptions]] = LFMLFOptions  # mgda_normalized narrows it
    needs_gram = True
    single_objective_shortcut = False

    def __init__(self, solver: str = "exact", floor: float = 0.0, normalize: str = "none"):
        super().__init__()
        if solver not in ("exact", "cvxpy"):
            raise ValueError(f"lfmlf solver must be 'exact' or 'cvxpy', got {solver!r}")
        if normalize not in NORMALIZERS:
            raise ValueError(f"lfmlf normalize must be one of {', '.join(NORMALIZERS)}, got {normalize!r}")
        self.solver = solver
        self.floor = check_floor(floor)
        self.normalize = normalize
        self._previous: Optional[np.ndarray] = None

    def weigh(self, losses: np.ndarray, gram: Optional[np.ndarray]) -> np.ndarray:
        assert gram is not None  # needs_gram: the base has checked it
        T = len(gram)
        if self.normalize == "none":
            w, cert = self._solve(gram)
            extra: dict[str, float] = {}
        else:
            c = self._normalizers(losses, gram)
            live = c > 0
            extra = {"left_out": float(T - live.sum())}
            if not live.any():  # nothing to normalise: every gradient (or loss) is zero
                self._state = {**extra, "floor": self.floor}
                return np.full(T, 1.0 / T)
            cl = c[live]
            v, cert = self._solve(gram[np.ix_(live, live)] / np.outer(cl, cl))
            w = np.zeros(T)
            w[live] = v / cl
            w /= w.sum()
        gw = gram @ w
        d_sq = cert.objective if self.normalize == "none" else max(float(w @ gw), 0.0)
        mean_sq = float(np.diag(gram).mean())
        self._state = {
            **cert.as_dict(),
            **extra,
            "fallback": float(cert.backend == "exact+wolfe"),
            "d_norm_sq": d_sq,
            "stationarity": d_sq / mean_sq if mean_sq > 0 else 0.0,
            "min_d_dot_g": float(gw.min()),
        }
        return w

    def _solve(self, gram: np.ndarray) -> tuple[np.ndarray, Certificate]:
        """The (floored) min-norm solve, warm-started from the previous call's weights when T is unchanged."""
        warm = self._previous if self._previous is not None and len(self._previous) == len(gram) else None
        w, cert = solve_min_norm(gram, floor=self.floor, backend=self.solver, warm_start=warm)
        self._previous = w
        return w, cert

    def _normalizers(self, losses: np.ndarray, gram: np.ndarray) -> np.ndarray:
        """c_t of Sener & Koltun's normaliser (0 where the objective is left out: zero gradient or zero loss)."""
        norms, nonzero = gradient_norms(gram)
        norms = np.where(nonzero, norms, 0.0)
        if self.normalize == "l2":
            return norms
        bad = ~np.isfinite(losses) | (losses < 0)
        if bad.any():
            t = int(np.argmax(bad))
            raise SolverInputError(
                f"normalize={self.normalize!r} divides each gradient by its loss, which must be finite and ≥ 0: "
                f"objective {t} has loss {losses[t]}"
            )
        return losses if self.normalize == "loss" else losses * norms
