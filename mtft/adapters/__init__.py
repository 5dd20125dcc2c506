"""Fine-tuning methods as registered objects (see :mod:`mtft.adapters.base`): ``full``, ``head``, ``lora``
(PEFT, an adapter per task) and Shared-A ``multi_lora``, each in its own folder with its displacement tracker,
enrolled in :mod:`mtft.adapters.registry` and imported when a run first uses it."""

from mtft.adapters.base import AdapterMethod, DisplacementTracker
from mtft.adapters.options import AdapterOptions, LoraOptions, MultiLoraOptions
from mtft.adapters.parameters import parameter_table
from mtft.adapters.registry import (
    METHODS,
    AdapterChoice,
    adapter_options,
    build_method,
    get_method,
    register_method,
)

__all__ = [
    "METHODS",
    "AdapterChoice",
    "AdapterMethod",
    "AdapterOptions",
    "DisplacementTracker",
    "LoraOptions",
    "MultiLoraOptions",
    "adapter_options",
    "build_method",
    "get_method",
    "parameter_table",
    "register_method",
]
