"""Which objectives make a step diverged: present ones with a non-finite loss (an absent one's NaN does not)."""

from __future__ import annotations

import math

import torch

from mtft.training.stopping import nonfinite_objectives

NAMES = ["xnli/en", "xnli/de", "xnli/ar"]


def test_present_nonfinite_losses_are_named_in_order():
    losses = torch.tensor([math.nan, 0.5, math.inf], dtype=torch.float64)
    assert nonfinite_objectives(losses, torch.tensor([3.0, 2.0, 1.0]), NAMES) == ["xnli/en", "xnli/ar"]


def test_an_absent_objective_is_not_divergence():
    losses = torch.tensor([0.7, math.nan, 0.2], dtype=torch.float64)
    assert nonfinite_objectives(losses, torch.tensor([4.0, 0.0, 4.0]), NAMES) == []


def test_stationarity_needs_patience_consecutive_steps_below_eps():
    from mtft.config.schema import WeightingSection
    from mtft.training.step import StepResult
    from mtft.training.stopping import Stationarity

    def result(gauge):
        empty = torch.zeros(1)
        return StepResult(empty, empty, empty, 0.0, 1, {} if gauge is None else {"stationarity": gauge})

    gauge = Stationarity(WeightingSection(method="lfmlf", stationarity_eps=1e-3, stationarity_patience=2))
    assert [gauge.reached(result(g)) for g in (1e-4, 1.0, 1e-4, None, 1e-4)] == [False, False, False, False, True]
    assert not Stationarity(WeightingSection()).reached(result(0.0))  # no eps: never


def test_a_signal_is_received_once_then_acts_as_uncaught_and_the_handlers_come_back():
    import os
    import signal

    from mtft.training.stopping import StopSignals

    before = signal.getsignal(signal.SIGTERM)
    with StopSignals(world_size=1) as signals:
        assert not signals.stop()
        os.kill(os.getpid(), signal.SIGTERM)  # delivered to the main thread before os.kill returns
        assert signals.stop() and signals.received == "SIGTERM"
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # a second one ends the process
    assert signal.getsignal(signal.SIGTERM) == before
