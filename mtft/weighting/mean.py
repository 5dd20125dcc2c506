"""The baseline: every present objective weighted equally."""

from __future__ import annotations

from typing import Optional

import numpy as np

from mtft.weighting.base import Weighting, WeightingOptions


class MeanWeighting(Weighting):
    """Linear scalarisation with equal weights: the plain mean of the present objectives' losses."""

    name = "mean"
    Options = WeightingOptions  # none

    def weigh(self, losses: np.ndarray, gram: Optional[np.ndarray]) -> np.ndarray:
        return np.full(len(losses), 1.0 / len(losses))
