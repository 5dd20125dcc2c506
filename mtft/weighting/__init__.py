"""Loss weightings: how the per-objective losses of a step are combined (see :mod:`mtft.weighting.base`)."""

from mtft.weighting.base import WEIGHTINGS, MeanWeighting, Weighting, build_weighting, register_weighting, weighting_class
from mtft.weighting import gram_methods  # noqa: F401  (registers lfmlf, mgda_normalized, pcgrad, cagrad, imtl_g, upgrad)

__all__ = ["WEIGHTINGS", "MeanWeighting", "Weighting", "build_weighting", "register_weighting", "weighting_class"]
