"""Which class ``weighting.method`` names: a built-in, a registered extension, or ``module:Class``.

:func:`weighting_class` is the one lookup that the config schema and the training engine use, so a name that
validates is a name that trains. Outside code adds a weighting either by naming it in the config as
``weighting.method: pkg.module:Class`` (imported on demand, nothing to register) or by decorating the class
with :func:`register_weighting` in a module that is imported before the config is loaded.
"""

from __future__ import annotations

import importlib
from typing import Any, Optional

from mtft.weighting.base import Weighting
from mtft.weighting.cagrad import CAGrad
from mtft.weighting.imtl_g import IMTLG
from mtft.weighting.lfmlf import LFMLF
from mtft.weighting.mean import MeanWeighting
from mtft.weighting.mgda_normalized import MGDANormalized
from mtft.weighting.pcgrad import PCGrad
from mtft.weighting.upgrad import UPGrad

WEIGHTINGS: dict[str, type[Weighting]] = {
    cls.name: cls for cls in (MeanWeighting, LFMLF, MGDANormalized, PCGrad, CAGrad, IMTLG, UPGrad)
}


def register_weighting(cls: type[Weighting]) -> type[Weighting]:
    """Class decorator: make ``cls`` selectable as ``weighting.method: <cls.name>``.

    A name already taken by another class is refused (re-importing the same module re-registers its class).
    """
    if not (isinstance(cls, type) and issubclass(cls, Weighting)):
        raise ValueError(f"register_weighting: {cls!r} is not a subclass of mtft.weighting.Weighting")
    name = getattr(cls, "name", "")
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"register_weighting: {_qualified(cls)} needs a class attribute `name` without ':'")
    taken = WEIGHTINGS.get(name)
    if taken is not None and _qualified(taken) != _qualified(cls):
        raise ValueError(f"register_weighting: the name {name!r} is taken by {_qualified(taken)}")
    WEIGHTINGS[name] = cls
    return cls


def weighting_class(method: str) -> type[Weighting]:
    """The class ``weighting.method`` selects: a registered name, or ``module:Class`` (imported here).

    Every failure is a ValueError of one line: the config loader reports it against the ``weighting.method``
    key.
    """
    if ":" not in method:
        if method not in WEIGHTINGS:
            raise ValueError(
                f"unknown weighting {method!r}; valid choices: {', '.join(sorted(WEIGHTINGS))}; or "
                "module:Class, a Weighting subclass in an importable module"
            )
        return WEIGHTINGS[method]
    module_name, _, attribute = method.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"weighting {method!r}: expected module:Class, e.g. mypackage.weightings:MyWeighting")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"weighting {method!r}: cannot import {module_name!r} ({error})") from None
    found: Any = module
    for part in attribute.split("."):  # Outer.Inner too
        found = getattr(found, part, None)
    if found is None:
        raise ValueError(f"weighting {method!r}: module {module_name!r} has no attribute {attribute!r}")
    if not (isinstance(found, type) and issubclass(found, Weighting)):
        what = _qualified(found) if isinstance(found, type) else repr(found)
        raise ValueError(f"weighting {method!r}: {what} is not a subclass of mtft.weighting.Weighting")
    if found.weigh is Weighting.weigh and found.__call__ is Weighting.__call__:
        raise ValueError(f"weighting {method!r}: {_qualified(found)} does not implement weigh(losses, gram)")
    return found


def build_weighting(method: str, options: Optional[dict[str, Any]] = None) -> Weighting:
    """An instance of the selected class with ``weighting.options`` as its constructor's keyword arguments."""
    return weighting_class(method)(**(options or {}))


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"
