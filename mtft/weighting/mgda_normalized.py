"""MGDA on l2-normalised gradients (Sener & Koltun, NeurIPS 2018): LF-MLF with ``normalize="l2"``."""

from __future__ import annotations

from mtft.weighting.lfmlf import LFMLF, MinNormOptions


class MGDANormalized(LFMLF):
    """MGDA on l2-normalised gradients (Sener & Koltun 2018, "Multi-task learning as multi-objective
    optimization", with their ``l2`` gradient normaliser): exactly ``lfmlf`` with ``normalize: l2``.

    The min-norm problem is solved on the unit vectors u_t = g_t/||g_t|| (Gram G_ts / (||g_t|| ||g_s||)),
    giving v; the direction is Σ_t v_t u_t = Σ_t (v_t/||g_t||) g_t, so the weights are v_t/||g_t||, rescaled to
    sum to 1 (only the direction is defined by the method; the step size is the optimiser's). Note: Sener &
    Koltun's released code applies v_t to the *unnormalised* losses instead; we follow the direction the
    normalised problem defines. Zero-norm objectives get weight 0 (``state()["left_out"]`` counts them); if all
    are zero, the weights are uniform. Options: ``solver`` and ``floor`` as for :class:`LFMLF`.
    """

    name = "mgda_normalized"
    Options = MinNormOptions

    def __init__(self, solver: str = "exact", floor: float = 0.0):
        super().__init__(solver=solver, floor=floor, normalize="l2")
