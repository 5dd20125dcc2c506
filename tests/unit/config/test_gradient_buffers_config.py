"""weighting.gradient_buffers: full by default, bfloat16 on request, anything else refused in one line."""

from __future__ import annotations

import pytest

from mtft.config import load_config
from mtft.core.errors import ConfigError
from tests.conftest import BASE_CONFIG, REPO


def load(*overrides: str):
    return load_config(REPO / BASE_CONFIG, list(overrides))


def test_full_by_default_and_bfloat16_on_request():
    assert load().weighting.gradient_buffers == "full"
    assert load("weighting.gradient_buffers=bfloat16").weighting.gradient_buffers == "bfloat16"


def test_another_precision_is_refused_in_one_line():
    with pytest.raises(ConfigError) as info:
        load("weighting.gradient_buffers=float16")
    message = str(info.value).strip()
    assert "\n" not in message and "gradient_buffers" in message and "bfloat16" in message
