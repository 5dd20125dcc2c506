"""The adapter-method API: one object per fine-tuning method (``model.adapter.method``), and their registry.

A method is everything a run, a restore, the forgetting monitors, the probe and the export need to know about
how the encoder is fine-tuned -- so that none of them compares the method's name (as PEFT keeps one tuner class
per method behind a registry). A method:

- *applies* itself to an encoder (:meth:`AdapterMethod.apply`): full fine-tuning leaves it trainable, the
  others freeze it and add their adapters;
- names its *routing slots* (:attr:`AdapterMethod.routing`, :meth:`AdapterMethod.slots`): the tasks or the
  loss objectives that each own an adapter, in the index order of the rows' ``task``/``objective`` labels
  (:mod:`mtft.core.rows`), or none when every row goes through the same weights;
- says whether a Gram weighting can use it (:attr:`AdapterMethod.supports_gram`) and which rows of its stacked
  parameters count as shared (:meth:`AdapterMethod.shared_rows`);
- builds the forgetting monitors' displacement tracker (:meth:`AdapterMethod.tracker`, the
  :class:`DisplacementTracker` protocol), or says why the monitors are off (:attr:`AdapterMethod.monitors_off`);
- names the adapters the sensitivity probe measures (:meth:`AdapterMethod.probe_slots`);
- hands out each slot's LoRA weights and PEFT config for ``run.py export`` where it has them.

Each method owns its typed options (``Options``, :mod:`mtft.adapters.options`): the keys of ``model.adapter``
beside ``method``. The built-in methods are enrolled in :mod:`mtft.adapters.registry`; outside code registers its own
with :func:`~mtft.adapters.registry.register_method`, or names it ``module:Class``.
"""

from __future__ import annotations

from typing import ClassVar, ContextManager, Optional, Protocol, Sequence

import torch
from torch import nn

from mtft.adapters.options import AdapterOptions
from mtft.core.errors import CheckpointError, ConfigError


class DisplacementTracker(Protocol):
    """Where the fine-tuned weights are relative to θ_p, every optimizer step (Mao et al., 2022, Theorem 1).

    Each *group* is one model θ_g whose distance is reported on its own: the one encoder of full fine-tuning
    (group ``""``), or each routing slot's adapter. Quantities are squared Frobenius norms over the parameters
    fine-tuning moves, in float64."""

    groups: list[str]

    def adapter(self, group: int) -> int:
        """The routing slot that :class:`~mtft.forgetting.mlm.MaskedLM` sends every row to, to measure ``group``."""

    def measure(self) -> tuple[list[float], list[float]]:
        """(||θ_{k+1} − θ_k||², ||θ_{k+1} − θ_p||²) per group; θ_k is only moved on by :meth:`advance`."""

    def advance(self) -> None:
        """θ_k ← the current weights."""

    def scale_update(self, alphas: Sequence[float]) -> None:
        """The forgetting budget's "scale" action, per group: θ ← θ_k + α_g·(θ − θ_k)."""

    def pretrained_point(self) -> dict[str, torch.Tensor]:
        """θ_p over :meth:`hessian_subset`'s parameters (names relative to the MaskedLM)."""

    def delta(self, group: int, names: list[str]) -> list[torch.Tensor]:
        """θ_group − θ_p on the parameters ``names``."""

    def hessian_subset(self) -> tuple[list[str], dict[str, torch.Tensor]]:
        """The parameters λ_p is taken over, and fixed values that put the rest of the model at θ_p."""

    def regularize(self, strength: float, accumulation: int) -> list:
        """Gradient hooks adding ∂(strength·Σ_g ||θ_g − θ_p||²)/∂θ over a step of ``accumulation`` backward
        passes; returns their handles."""

    def at_pretrained(self) -> ContextManager[None]:
        """The model holds θ_p inside the block, exactly its current weights after it."""


class AdapterMethod:
    """Base class of the fine-tuning methods. Subclasses set :attr:`name` and :attr:`Options` and implement
    :meth:`inject`; the defaults describe a method without options or routing, Gram-compatible, unmonitored and not
    exportable."""

    name: ClassVar[str]
    # The method's typed options (a subclass of AdapterOptions): the keys of model.adapter beside method.
    Options: ClassVar[type[AdapterOptions]] = AdapterOptions
    # A Gram weighting needs exact per-objective gradients (mtft.gradients) of the method's trainable parameters.
    supports_gram: ClassVar[bool] = True
    # Completes "weighting.method=... needs per-objective gradients, " when supports_gram is False.
    gram_refusal: ClassVar[str] = "which this model.adapter.method does not provide; use weighting.method=mean"
    # Why the forgetting monitors are off with this method (completes "model.adapter.method=<name> ..."),
    # or None when :meth:`tracker` follows it.
    monitors_off: ClassVar[Optional[str]] = "has no displacement tracker (AdapterMethod.tracker) to follow L_p with"
    # Whether the method trains the encoder's own weights (full fine-tuning), rather than freezing them: what a
    # regulariser of the pre-trained weights themselves, such as Mixout (stability.mixout), needs.
    trains_encoder: ClassVar[bool] = False
    # Whether every routing slot is a LoRA adapter (A, B) that ``run.py export`` writes as a PEFT directory.
    exports_lora: ClassVar[bool] = False

    def __init__(self, options: Optional[AdapterOptions] = None):
        self.options = options if options is not None else self.Options()

    # -- the model ---------------------------------------------------------------------------------------
    def apply(self, encoder: nn.Module, task_names: Sequence[str], objective_names: Sequence[str], seed: int) -> None:
        """Make ``encoder`` ready for training with this method, in place. ``task_names`` are the run's tasks
        and ``objective_names`` its loss objectives, each in index order; ``seed`` draws any random adapter
        weights. An option that does not fit the encoder (a target matching no layer) is a ConfigError."""
        try:
            self.inject(encoder, list(task_names), list(objective_names), seed)
        except ValueError as error:
            raise ConfigError(f"model.adapter: {error}") from None

    def inject(self, encoder: nn.Module, task_names: list[str], objective_names: list[str], seed: int) -> None:
        """:meth:`apply` without the error translation: raise ValueError for options that do not fit."""
        raise NotImplementedError

    # -- routing -----------------------------------------------------------------------------------------
    @property
    def routing(self) -> Optional[str]:
        """The row label that picks an adapter (``"task"`` or ``"objective"``), or None: no routing."""
        return None

    def slots(self, task_names: Sequence[str], objective_names: Sequence[str]) -> list[str]:
        """The adapters' names in slot order (slot i serves the rows labelled i); empty without routing."""
        if self.routing is None:
            return []
        return list(task_names if self.routing == "task" else objective_names)

    def probe_slots(self, task_names: Sequence[str], objective_names: Sequence[str]) -> list[str]:
        """The models a sensitivity probe measures, each routed to its slot: every adapter, or the one
        fine-tuned encoder (named ``""``) when nothing is routed."""
        return self.slots(task_names, objective_names) or [""]

    # -- the Gram of per-objective gradients ---------------------------------------------------------------
    def shared_rows(
        self, model: nn.Module, task_users: Sequence[int], num_objectives: int
    ) -> dict[nn.Parameter, torch.Tensor]:
        """The method's parameters stacked over its routing slots (slot j's weights in row j), each with the
        rows that more than one objective updates -- the only rows of it that a Gram over shared parameters
        counts (an empty tensor: none). ``task_users[i]`` is the number of objectives that train task i.
        Parameters not returned are judged like any encoder weight (:func:`mtft.training.setup.shared_parameters`)."""
        return {}

    def slot_users(self, task_users: Sequence[int], num_objectives: int) -> torch.Tensor:
        """How many objectives update each routing slot's adapter."""
        if self.routing == "task":
            return torch.tensor(list(task_users), dtype=torch.long)
        return torch.ones(num_objectives, dtype=torch.long)  # one objective per objective slot

    # -- forgetting monitors -----------------------------------------------------------------------------
    def tracker(
        self, encoder: nn.Module, task_names: Sequence[str], objective_names: Sequence[str]
    ) -> Optional[DisplacementTracker]:
        """The displacement tracker of ``encoder`` (applied with this method), or None (see :attr:`monitors_off`)."""
        return None

    # -- export ------------------------------------------------------------------------------------------
    def peft_config(self):
        """The ``peft.LoraConfig`` every exported adapter is saved with."""
        raise CheckpointError(f"model.adapter.method={self.label()} has no LoRA adapters to export")

    def adapter_weights(
        self, encoder: nn.Module, slot: int, slot_name: str
    ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Adapted layer name (in ``encoder``) -> (A, B) of routing slot ``slot`` (named ``slot_name``)."""
        raise CheckpointError(f"model.adapter.method={self.label()} has no LoRA adapters to export")

    def label(self) -> str:
        """The method's name in messages: its registered name, else its class's."""
        return getattr(type(self), "name", type(self).__qualname__)
