"""Loss weightings: how the per-objective losses of a step are combined.

One module per method over the :class:`Weighting` base (:mod:`mtft.weighting.base`); the lookup of
``weighting.method`` -- a built-in name, a registered one, or ``module:Class`` -- is :mod:`mtft.weighting.registry`.
"""

from mtft.weighting.base import Weighting, WeightingOptions
from mtft.weighting.cagrad import CAGrad
from mtft.weighting.imtl_g import IMTLG
from mtft.weighting.lfmlf import LFMLF
from mtft.weighting.mean import MeanWeighting
from mtft.weighting.mgda_normalized import MGDANormalized
from mtft.weighting.pcgrad import PCGrad
from mtft.weighting.registry import (
    WEIGHTINGS,
    build_weighting,
    register_weighting,
    weighting_class,
    weighting_options,
)
from mtft.weighting.upgrad import UPGrad

__all__ = [
    "CAGrad",
    "IMTLG",
    "LFMLF",
    "MGDANormalized",
    "MeanWeighting",
    "PCGrad",
    "UPGrad",
    "WEIGHTINGS",
    "Weighting",
    "WeightingOptions",
    "build_weighting",
    "register_weighting",
    "weighting_class",
    "weighting_options",
]
