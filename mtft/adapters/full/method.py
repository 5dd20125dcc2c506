"""``model.adapter.method: full``."""

from __future__ import annotations

from typing import Sequence

from torch import nn

from mtft.adapters.base import AdapterMethod
from mtft.adapters.full.displacement import FullDisplacement
from mtft.adapters.options import AdapterOptions


class FullFineTuning(AdapterMethod):
    """Every encoder weight trains: the encoder is left as built (trainable), no routing, one model to monitor."""

    name = "full"
    Options = AdapterOptions
    monitors_off = None
    trains_encoder = True

    def inject(self, encoder: nn.Module, task_names: list[str], objective_names: list[str], seed: int) -> None:
        pass

    def tracker(
        self, encoder: nn.Module, task_names: Sequence[str], objective_names: Sequence[str]
    ) -> FullDisplacement:
        return FullDisplacement(encoder)
