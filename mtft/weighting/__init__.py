"""Loss weightings: how the per-objective losses of a step are combined (see :mod:`mtft.weighting.base`)."""

from mtft.weighting.base import WEIGHTINGS, MeanWeighting, Weighting, build_weighting, register_weighting

__all__ = ["WEIGHTINGS", "MeanWeighting", "Weighting", "build_weighting", "register_weighting"]
