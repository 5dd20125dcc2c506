"""stability.mixout: refused, in one line, where Mixout cannot mean what it says -- a frozen encoder, a Gram
weighting or the descent check (their per-objective gradients would miss the mask), the pre-training stage."""

from __future__ import annotations

import pytest

from mtft.config import load_config
from mtft.core.errors import ConfigError
from tests.helpers.launch import REPO
from tests.helpers.runs import BASE_CONFIG

MEAN = ["weighting.method=mean", "weighting.options={}"]


def load(*overrides: str):
    return load_config(REPO / BASE_CONFIG, list(overrides))


def test_mixout_with_full_fine_tuning_and_a_plain_weighting_loads():
    assert load("stability.mixout=0.1", *MEAN).stability.mixout == 0.1


@pytest.mark.parametrize("method", ["head", "lora", "multi_lora"])
def test_mixout_with_a_frozen_encoder_is_refused(method):
    with pytest.raises(ConfigError) as info:
        load("stability.mixout=0.1", f"model.adapter.method={method}", *MEAN)
    message = str(info.value)
    assert "\n" not in message.strip()
    assert "stability.mixout=0.1" in message and f"model.adapter.method={method} freezes them" in message


def test_mixout_with_a_gram_weighting_is_refused():
    with pytest.raises(ConfigError) as info:
        load("stability.mixout=0.1")  # the base run weights with LF-MLF
    message = str(info.value)
    assert "\n" not in message.strip()
    assert (
        "weighting.method=lfmlf" in message and "M/(1−p)" in message and message.endswith("use weighting.method=mean")
    )


def test_mixout_with_the_descent_check_is_refused():
    with pytest.raises(ConfigError, match="stability.mixout=0.1 with gradients.descent_check: "):
        load("stability.mixout=0.1", *MEAN, "gradients.descent_check=true")


def test_mixout_off_combines_with_everything():
    assert load("stability.mixout=0", "model.adapter.method=head", *MEAN).stability.mixout == 0.0
    assert load("stability.mixout=0").weighting.method == "lfmlf"


@pytest.mark.parametrize("value", ["1.0", "-0.1"])
def test_mixout_probability_out_of_range_is_refused(value):
    with pytest.raises(ConfigError, match="stability.mixout"):
        load(f"stability.mixout={value}", *MEAN)
