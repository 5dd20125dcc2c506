"""Which method ``model.adapter.method`` names, and the typed options of its section.

The built-in methods are enrolled here, each once: its name, its ``Options`` (known without importing the method)
and a loader whose ``import`` brings the method in when a run first asks for it -- LoRA's imports PEFT, which costs
seconds that validating a config or ``run.py --help`` need not pay. Outside code registers a method of its own with
:func:`register_method` or names it ``module:Class`` in the config.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol

from mtft.adapters.base import AdapterMethod
from mtft.adapters.options import AdapterOptions, LoraOptions, MultiLoraOptions
from mtft.core.registry import Registry

METHODS: Registry[AdapterMethod] = Registry("adapter method", AdapterMethod)


@METHODS.lazy("full", AdapterOptions)
def _full() -> type:
    from mtft.adapters.full.method import FullFineTuning

    return FullFineTuning


@METHODS.lazy("head", AdapterOptions)
def _head() -> type:
    from mtft.adapters.head.method import HeadOnly

    return HeadOnly


@METHODS.lazy("lora", LoraOptions)
def _lora() -> type:
    from mtft.adapters.lora.method import PeftLora

    return PeftLora


@METHODS.lazy("multi_lora", MultiLoraOptions)
def _multi_lora() -> type:
    from mtft.adapters.multi_lora.method import MultiLora

    return MultiLora


class AdapterChoice(Protocol):
    """The run config's ``model.adapter``: the method's name and its typed options."""

    method: str
    options: AdapterOptions


def register_method(cls: type[AdapterMethod]) -> type[AdapterMethod]:
    """Class decorator: make ``cls`` selectable as ``model.adapter.method: <cls.name>`` (a name taken by another
    class is refused)."""
    return METHODS.register(cls)


def get_method(name: str) -> type[AdapterMethod]:
    """The class named by ``model.adapter.method``: a registered name, or ``module:Class`` for a method of
    one's own (an importable module, a subclass of :class:`AdapterMethod`). ValueError naming the choices."""
    return METHODS.get(name)


def adapter_options(method: str, given: Mapping[str, Any]) -> AdapterOptions:
    """``given`` (the keys of ``model.adapter`` beside ``method``) typed by the method's ``Options``; one ValueError
    line naming a foreign option's owner, or an ill-typed option."""
    return METHODS.typed_options(method, given)  # type: ignore[return-value]


def build_method(choice: AdapterChoice) -> AdapterMethod:
    """The method object of ``choice`` (the run config's ``model.adapter``)."""
    return get_method(choice.method)(choice.options)
