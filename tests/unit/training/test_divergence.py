"""Which objectives make a step diverged: present ones with a non-finite loss (an absent one's NaN does not)."""

from __future__ import annotations

import math

import torch

from mtft.training.trainer import nonfinite_objectives

NAMES = ["xnli/en", "xnli/de", "xnli/ar"]


def test_present_nonfinite_losses_are_named_in_order():
    losses = torch.tensor([math.nan, 0.5, math.inf], dtype=torch.float64)
    assert nonfinite_objectives(losses, torch.tensor([3.0, 2.0, 1.0]), NAMES) == ["xnli/en", "xnli/ar"]


def test_an_absent_objective_is_not_divergence():
    losses = torch.tensor([0.7, math.nan, 0.2], dtype=torch.float64)
    assert nonfinite_objectives(losses, torch.tensor([4.0, 0.0, 4.0]), NAMES) == []
