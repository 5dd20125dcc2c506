"""``model.adapter.method: head``."""

from __future__ import annotations

from torch import nn

from mtft.adapters.base import AdapterMethod
from mtft.adapters.options import AdapterOptions


class HeadOnly(AdapterMethod):
    """The encoder is frozen and only the task heads train -- the linear-probe baseline. With the encoder's
    weights fixed, the masked-LM loss L_p cannot change, so there is nothing for the forgetting monitors."""

    name = "head"
    Options = AdapterOptions
    monitors_off = "keeps the encoder frozen, so L_p cannot change (F_p = 0)"

    def inject(self, encoder: nn.Module, task_names: list[str], objective_names: list[str], seed: int) -> None:
        encoder.requires_grad_(False)
