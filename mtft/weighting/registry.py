"""Which class ``weighting.method`` names: a built-in, a registered extension, or ``module:Class``.

:func:`weighting_class` is the one lookup that the config schema and the training engine use, so a name that
validates is a name that trains. Outside code adds a weighting either by naming it in the config as
``weighting.method: pkg.module:Class`` (imported on demand, nothing to register) or by decorating the class
with :func:`register_weighting` in a module that is imported before the config is loaded.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from mtft.core.errors import echo
from mtft.core.registry import Registry
from mtft.weighting.base import Weighting
from mtft.weighting.cagrad import CAGrad
from mtft.weighting.imtl_g import IMTLG
from mtft.weighting.lfmlf import LFMLF
from mtft.weighting.mean import MeanWeighting
from mtft.weighting.mgda_normalized import MGDANormalized
from mtft.weighting.pcgrad import PCGrad
from mtft.weighting.upgrad import UPGrad


def _implemented(cls: type[Weighting]) -> Optional[str]:
    if cls.weigh is Weighting.weigh and cls.__call__ is Weighting.__call__:
        return "does not implement weigh(losses, gram)"
    return None


WEIGHTINGS: Registry[Weighting] = Registry(
    "weighting",
    Weighting,
    {cls.name: cls for cls in (MeanWeighting, LFMLF, MGDANormalized, PCGrad, CAGrad, IMTLG, UPGrad)},
    check=_implemented,
)


def register_weighting(cls: type[Weighting]) -> type[Weighting]:
    """Class decorator: make ``cls`` selectable as ``weighting.method: <cls.name>``.

    A name already taken by another class is refused (re-importing the same module re-registers its class).
    """
    return WEIGHTINGS.register(cls)


def weighting_class(method: str) -> type[Weighting]:
    """The class ``weighting.method`` selects: a registered name, or ``module:Class`` (imported here).

    Every failure is a ValueError of one line: the config loader reports it against the ``weighting.method``
    key.
    """
    return WEIGHTINGS.get(method)


def weighting_options(method: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` checked against the ``Options`` model of the weighting ``method`` selects: the options given,
    typed (defaults are the constructor's, not written out). One ValueError line naming the bad option and the valid
    ones; an option that another weighting takes says which (:meth:`mtft.core.registry.Registry.typed_options`). A
    class of one's own without ``Options`` is constructed to check them."""
    cls = weighting_class(method)
    if cls.Options is None:
        try:
            cls(**options)
        except (TypeError, ValueError) as error:
            raise ValueError(f"options {echo(dict(options))} do not fit weighting {method!r}: {error}") from None
        return dict(options)
    given = WEIGHTINGS.typed_options(method, options).model_dump(exclude_unset=True)
    try:
        cls(**given)  # the constructor's own checks
    except (TypeError, ValueError) as error:
        raise ValueError(f"weighting {method!r}: {error}") from None
    return given


def build_weighting(method: str, options: Optional[dict[str, Any]] = None) -> Weighting:
    """An instance of the selected class with ``weighting.options`` as its constructor's keyword arguments."""
    return weighting_class(method)(**(options or {}))
