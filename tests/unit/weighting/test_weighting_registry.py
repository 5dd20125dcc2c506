"""``weighting.method``: a built-in name, a registered one, or ``module:Class`` of a Weighting subclass defined
outside the library; every mistake is one line naming what is wrong."""

from __future__ import annotations

import sys
import textwrap

import numpy as np
import pytest

import mtft.weighting as weighting
from mtft.config import load_config
from mtft.core.errors import ConfigError
from mtft.weighting import LFMLF, WEIGHTINGS, Weighting, build_weighting, register_weighting, weighting_class
from tests.helpers.launch import REPO

MODULE = "mtft_test_user_weightings"  # written into tmp_path by the fixture
USER_CODE = '''
import numpy as np

from mtft.weighting import Weighting


class InverseNorm(Weighting):
    """w_t ∝ ||g_t||^-power: a user's Gram weighting with one option."""

    needs_gram = True

    def __init__(self, power: float = 1.0):
        super().__init__()
        if power <= 0:
            raise ValueError(f"power must be positive, got {power}")
        self.power = power

    def weigh(self, losses, gram):
        w = np.sqrt(np.diag(gram)) ** -self.power
        self._state = {"spread": float(w.max() / w.min())}
        return w / w.sum()


class Holder:
    Nested = InverseNorm


class NotAWeighting:
    def __call__(self, losses, gram=None):
        return np.ones(len(losses))


class Unimplemented(Weighting):
    pass
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / f"{MODULE}.py").write_text(textwrap.dedent(USER_CODE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield MODULE
    sys.modules.pop(MODULE, None)


@pytest.fixture
def restored_registry():
    saved = WEIGHTINGS.snapshot()
    yield WEIGHTINGS
    WEIGHTINGS.restore(saved)


def _load(monkeypatch, *overrides: str):
    monkeypatch.chdir(REPO)
    return load_config(REPO / "tests/e2e/base.yaml", list(overrides))


def test_public_names():
    assert {
        "Weighting",
        "WEIGHTINGS",
        "build_weighting",
        "register_weighting",
        "weighting_class",
        "MeanWeighting",
    } <= set(weighting.__all__)
    assert sorted(WEIGHTINGS) == ["cagrad", "imtl_g", "lfmlf", "mean", "mgda_normalized", "pcgrad", "upgrad"]
    assert weighting_class("lfmlf") is LFMLF


def test_user_weighting_from_module_class_through_the_config(user_module, monkeypatch):
    config = _load(monkeypatch, f"weighting.method={user_module}:InverseNorm", "weighting.options={power: 2}")
    cls = weighting_class(config.weighting.method)
    assert cls.__module__ == user_module and cls.needs_gram
    m = build_weighting(config.weighting.method, config.weighting.options)
    w = m(np.ones(2), np.diag([1.0, 4.0]))  # ||g|| = 1, 2 -> w ∝ 1, 1/4
    assert np.allclose(w, [0.8, 0.2]) and m.state() == {"spread": 4.0}
    assert m(np.ones(1), np.eye(1)).tolist() == [1.0]  # the base's checks and T = 1 apply to it too
    with pytest.raises(ValueError, match="needs_gram"):
        m(np.ones(2))
    assert weighting_class(f"{user_module}:Holder.Nested") is cls


@pytest.mark.parametrize(
    "method, expected",
    [
        (
            "magic",
            "unknown weighting 'magic'; valid choices: cagrad, imtl_g, lfmlf, mean, mgda_normalized, pcgrad, "
            "upgrad; or module:Class, a mtft.weighting.base.Weighting subclass in an importable module",
        ),
        (
            "no_such_module_xyz:Foo",
            "weighting 'no_such_module_xyz:Foo': cannot import 'no_such_module_xyz' "
            "(No module named 'no_such_module_xyz')",
        ),
        ("{m}:Missing", "weighting '{m}:Missing': module '{m}' has no attribute 'Missing'"),
        (
            "{m}:NotAWeighting",
            "weighting '{m}:NotAWeighting': {m}.NotAWeighting is not a subclass of mtft.weighting.base.Weighting",
        ),
        ("{m}:np", "weighting '{m}:np': <module 'numpy'"),
        ("{m}:Unimplemented", "{m}.Unimplemented does not implement weigh(losses, gram)"),
        ("mtft.weighting:Weighting", "mtft.weighting.base.Weighting does not implement weigh(losses, gram)"),
        (":Foo", "weighting ':Foo': expected module:Class, e.g. mypackage.mymodule:MyClass"),
    ],
)
def test_bad_method_is_one_line_naming_the_problem(user_module, monkeypatch, method, expected):
    method, expected = method.format(m=user_module), expected.format(m=user_module)
    with pytest.raises(ValueError) as direct:
        weighting_class(method)
    assert expected in str(direct.value) and "\n" not in str(direct.value)
    with pytest.raises(ConfigError) as info:
        _load(monkeypatch, f"weighting.method={method}")
    message = str(info.value)
    assert "weighting.method" in message and expected in message and "\n" not in message


@pytest.mark.parametrize(
    "options, expected",
    [
        ("{power: -1}", "power must be positive, got -1"),
        ("{exponent: 2}", "unexpected keyword argument 'exponent'"),
    ],
)
def test_bad_options_of_a_user_weighting_are_one_line(user_module, monkeypatch, options, expected):
    with pytest.raises(ConfigError) as info:
        _load(monkeypatch, f"weighting.method={user_module}:InverseNorm", f"weighting.options={options}")
    message = str(info.value)
    assert f"do not fit weighting '{user_module}:InverseNorm'" in message and expected in message
    assert "\n" not in message


def test_lfmlf_floor_and_normalize_load_from_the_config(monkeypatch):
    config = _load(monkeypatch, "weighting.method=lfmlf", "weighting.options={floor: 0.1, normalize: loss+}")
    m = build_weighting(config.weighting.method, config.weighting.options)
    assert isinstance(m, LFMLF) and (m.floor, m.normalize) == (0.1, "loss+")


@pytest.mark.parametrize(
    "options, expected",
    [
        ("{floor: 1.5}", "option 'floor': Input should be less than or equal to 1 (got 1.5)"),
        ("{floor: .nan}", "option 'floor': Input should be a finite number (got nan)"),
        ("{floor: high}", "option 'floor': Input should be a valid number, unable to parse string as a number"),
        ("{normalize: l1}", "option 'normalize': Input should be 'none', 'l2', 'loss' or 'loss+' (got 'l1')"),
    ],
)
def test_bad_lfmlf_options_are_one_line(monkeypatch, options, expected):
    with pytest.raises(ConfigError) as info:
        _load(monkeypatch, "weighting.method=lfmlf", f"weighting.options={options}")
    message = str(info.value)
    assert "weighting.options: weighting 'lfmlf', " in message and expected in message and "\n" not in message


def test_register_weighting_makes_a_name(user_module, restored_registry, monkeypatch):
    cls = weighting_class(f"{user_module}:InverseNorm")
    named = type("Inverse", (cls,), {"name": "inverse_norm", "__module__": user_module})
    assert register_weighting(named) is named and register_weighting(named) is named  # re-registering is a no-op
    config = _load(monkeypatch, "weighting.method=inverse_norm")
    assert type(build_weighting(config.weighting.method)) is named


def test_register_weighting_refuses_what_it_cannot_select(restored_registry):
    class Clash(Weighting):
        name = "lfmlf"

        def weigh(self, losses, gram):
            return losses

    class Nameless(Weighting):
        pass

    class Colon(Weighting):
        name = "a:b"

    with pytest.raises(ValueError, match="weighting name 'lfmlf' is taken by mtft.weighting.lfmlf.LFMLF"):
        register_weighting(Clash)
    for cls in (Nameless, Colon):
        with pytest.raises(ValueError, match="needs a class attribute `name` without ':'"):
            register_weighting(cls)
    with pytest.raises(ValueError, match="is not a subclass"):
        register_weighting(dict)  # type: ignore[arg-type]
    assert WEIGHTINGS["lfmlf"] is LFMLF
