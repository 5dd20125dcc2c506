"""Fine-tuning methods as registered objects (see :mod:`mtft.adapters.base`): ``full``, ``head``, ``lora``
(PEFT, an adapter per task) and Shared-A ``multi_lora``, each in its own folder with its displacement tracker."""

from mtft.adapters import full, head, lora, multi_lora  # noqa: F401  (registers the built-in methods)
from mtft.adapters.base import (
    METHODS,
    AdapterMethod,
    AdapterOptions,
    DisplacementTracker,
    build_method,
    get_method,
    register_method,
)
from mtft.adapters.parameters import parameter_table

__all__ = [
    "METHODS",
    "AdapterMethod",
    "AdapterOptions",
    "DisplacementTracker",
    "build_method",
    "get_method",
    "parameter_table",
    "register_method",
]
