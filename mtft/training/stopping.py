"""The loop's stop conditions besides its step budget and early stopping (:mod:`mtft.training.selection`): a
signal (SIGTERM, Ctrl-C), a non-finite loss, Pareto stationarity. The forgetting budget is the monitor's."""

from __future__ import annotations

import math
import signal
from typing import Optional

import torch

from mtft.config.schema import WeightingSection
from mtft.core.errors import Diverged
from mtft.training.step import StepResult


class StopSignals:
    """SIGTERM or Ctrl-C while the loop runs: the loop finishes its step, saves and stops; a second one of either
    kind acts as if mtft had not caught it (Ctrl-C raises KeyboardInterrupt, SIGTERM ends the process). A context
    manager: the previous handlers come back on exit."""

    def __init__(self, world_size: int):
        self.world_size = world_size
        self.received: Optional[str] = None  # the signal's name

    def __enter__(self) -> "StopSignals":
        self.previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def _on_signal(self, signum, frame) -> None:
        self.received = signal.Signals(signum).name
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def stop(self) -> bool:
        """Whether any rank received one: every rank stops after the same step, or the collectives would hang."""
        stop = self.received is not None
        if self.world_size > 1:
            flag = torch.tensor([int(stop)])
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            stop = bool(flag.item())
        return stop


def nonfinite_objectives(losses: torch.Tensor, counts: torch.Tensor, names: list[str]) -> list[str]:
    """The objectives present in a step (count > 0) whose loss is NaN or infinite; an absent one's NaN is not."""
    return [
        n for n, loss, count in zip(names, losses.tolist(), counts.tolist()) if count > 0 and not math.isfinite(loss)
    ]


def diverged(bad: list[str], losses: torch.Tensor, names: list[str], step: int, saved_step: Optional[int]) -> Diverged:
    """The error that ends a run whose loss is non-finite (the objectives ``bad``), rather than training on NaN
    weights to a report of NaN metrics and exit status 0. Every rank sees the same (all-reduced) losses, so every
    rank stops."""
    value = float(losses[names.index(bad[0])])
    saved = f"the last checkpoint is step {saved_step}" if saved_step else "no checkpoint was saved"
    return Diverged(
        f"training diverged at step {step}: the loss of {bad[0]} is {value}"
        f"{f' ({len(bad)} of {len(names)} objectives non-finite)' if len(bad) > 1 else ''}; {saved}. "
        "Lower training.optimizer.lr or keep training.gradient_clipping on, and start again"
    )


class Stationarity:
    """Pareto stationarity (Mao et al., 2022, Theorem 3): ``weighting.stationarity_patience`` consecutive steps
    with ||d||²/mean_t ||g_t||² below ``weighting.stationarity_eps``."""

    def __init__(self, weighting: WeightingSection, run: int = 0):
        self.eps, self.patience, self.run = weighting.stationarity_eps, weighting.stationarity_patience, run

    def reached(self, result: StepResult) -> bool:
        if self.eps is None or "stationarity" not in result.extras:
            return False
        self.run = self.run + 1 if result.extras["stationarity"] < self.eps else 0
        return self.run >= self.patience
