"""Typed weighting options: each weighting's ``Options`` model is its constructor's keyword arguments, checked with
the run config (one line naming the bad option and the valid ones), and options follow ``weighting.method``."""

from __future__ import annotations

import inspect

import pytest

from mtft.config import load_config
from mtft.core.errors import ConfigError
from mtft.weighting import WEIGHTINGS, weighting_options
from tests.helpers.launch import REPO


def _load(monkeypatch, config: str, *overrides: str):
    monkeypatch.chdir(REPO)
    return load_config(REPO / config, list(overrides))


@pytest.mark.parametrize("name", sorted(WEIGHTINGS))
def test_every_weighting_has_an_options_model_that_is_its_constructors_keywords(name):
    cls = WEIGHTINGS.get(name)
    assert cls.Options is not None
    keywords = {p.name: p.default for p in inspect.signature(cls.__init__).parameters.values() if p.name != "self"}
    assert {option: field.default for option, field in cls.Options.model_fields.items()} == keywords
    assert all(field.description for field in cls.Options.model_fields.values())  # what --help prints


def test_options_are_typed_when_the_config_loads(monkeypatch):
    config = _load(monkeypatch, "tests/e2e/base.yaml", "weighting.method=cagrad", "weighting.options={c: '0.5'}")
    assert config.weighting.options == {"c": 0.5}  # only what was given: the defaults stay the constructor's
    assert weighting_options("lfmlf", {}) == {}


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["weighting.options.flor=0.1"],
            "weighting.options: 'flor' is not an option of weighting 'lfmlf'; valid options: solver, floor, normalize",
        ),
        (
            ["weighting.method=mean", "weighting.options.floor=0.1"],
            "'floor' is not an option of weighting 'mean' (an option of lfmlf, mgda_normalized); valid options: none",
        ),
        (
            ["weighting.method=mgda_normalized", "weighting.options.normalize=l2"],
            "'normalize' is not an option of weighting 'mgda_normalized' (an option of lfmlf); valid options: solver, "
            "floor",
        ),
        (["weighting.method=pcgrad", "weighting.options.seed=x"], "weighting 'pcgrad', option 'seed': Input should"),
    ],
)
def test_an_option_the_method_does_not_take_is_named_with_the_valid_ones(monkeypatch, overrides, message):
    with pytest.raises(ConfigError) as error:
        _load(monkeypatch, "configs/demo.yaml", *overrides)
    assert message in str(error.value) and "[command line]" in str(error.value) and "\n" not in str(error.value)


def test_switching_the_method_on_the_command_line_drops_the_files_options(monkeypatch):
    assert _load(monkeypatch, "configs/demo.yaml").weighting.options == {"floor": 0.3}  # written for lfmlf
    switched = _load(monkeypatch, "configs/demo.yaml", "weighting.method=mean")
    assert (switched.weighting.method, switched.weighting.options) == ("mean", {})
    own = _load(monkeypatch, "configs/demo.yaml", "weighting.method=mgda_normalized", "weighting.options.solver=cvxpy")
    assert own.weighting.options == {"solver": "cvxpy"}  # the file's floor belonged to lfmlf
    same = _load(monkeypatch, "configs/demo.yaml", "weighting.method=lfmlf", "weighting.options.normalize=l2")
    assert same.weighting.options == {"floor": 0.3, "normalize": "l2"}  # the same method: the file's options stay
