"""cvxpy is an extra: the exact solver needs nothing, and asking for the cvxpy reference without it installed is one
line at config time saying what to install."""

from __future__ import annotations

import importlib.util

import pytest

from mtft.config import validate_config
from mtft.core.errors import ConfigError


def config(solver: str):
    raw = {"data": {"tasks": [{"name": "xnli"}]}, "weighting": {"method": "lfmlf", "options": {"solver": solver}}}
    return validate_config(raw, source="test")


def test_the_cvxpy_solver_without_cvxpy_is_refused_naming_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "cvxpy" else real(name, *a))
    with pytest.raises(ConfigError, match=r"weighting\.options.*solver 'cvxpy' needs the cvxpy package: pip install"):
        config("cvxpy")
    assert config("exact").weighting.options["solver"] == "exact"  # the default needs nothing


def test_with_cvxpy_installed_the_reference_solver_is_accepted():
    assert config("cvxpy").weighting.options["solver"] == "cvxpy"
