"""gradients.buffers: full by default, bfloat16 on request, anything else refused in one line; the
bufferless step's update from a tape by default, by a second backward pass on request, refused where it cannot be
exact."""

from __future__ import annotations

import pytest

from mtft.config import load_config
from mtft.core.errors import ConfigError
from tests.helpers.launch import REPO
from tests.helpers.runs import BASE_CONFIG


def load(*overrides: str):
    return load_config(REPO / BASE_CONFIG, list(overrides))


def test_full_by_default_and_bfloat16_on_request():
    assert load().gradients.buffers == "full"
    assert load("gradients.buffers=bfloat16").gradients.buffers == "bfloat16"


def test_another_precision_is_refused_in_one_line():
    with pytest.raises(ConfigError) as info:
        load("gradients.buffers=float16")
    message = str(info.value).strip()
    assert "\n" not in message and "gradients.buffers" in message and "bfloat16" in message


def test_the_bufferless_update_is_a_tape_by_default_and_a_second_backward_on_request():
    assert load().gradients.update == "tape"
    second = load("gradients.buffers=none", "gradients.update=backward")
    assert second.gradients.update == "backward"


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["gradients.update=backward"],
            "gradients.update set the bufferless step, which gradients.buffers=full",
        ),
        (
            ["gradients.chunk_mb=4"],
            "gradients.chunk_mb set the bufferless step, which gradients.buffers=full",
        ),
        (
            [
                "gradients.buffers=bfloat16",
                "gradients.update=backward",
                "gradients.chunk_mb=4",
            ],
            "gradients.update, gradients.chunk_mb set the bufferless step, which gradients.buffers=bfloat16",
        ),
        (
            ["gradients.budget_gb=2"],
            "gradients.budget_gb decides gradients.buffers=auto's choice",
        ),
        (
            ["gradients.buffers=none", "gradients.budget_gb=2"],
            "with gradients.buffers=none it does nothing",
        ),
    ],
)
def test_a_setting_the_chosen_buffers_never_read_is_refused(overrides, message):
    """A bufferless option under buffers, a budget without auto: one line, not recorded as if it applied (the
    options apply where they do: none and auto for the bufferless ones, auto for the budget)."""
    with pytest.raises(ConfigError) as info:
        load(*overrides)
    assert message in str(info.value) and "\n" not in str(info.value).strip()
    load("gradients.buffers=auto", "gradients.budget_gb=2", "gradients.chunk_mb=4")


@pytest.mark.parametrize(
    "override, message",
    [
        ("training.gradient_accumulation_steps=2", "exact for one micro-batch a step"),
        ("gradients.descent_check=true", "re-forms the per-objective products after the step"),
    ],
)
def test_the_second_backward_refuses_what_it_cannot_form_exactly(override, message):
    for buffers in ("none", "auto"):
        with pytest.raises(ConfigError) as info:
            load(f"gradients.buffers={buffers}", "gradients.update=backward", override)
        text = str(info.value).strip()
        assert "\n" not in text and message in text and "use gradients.update=tape" in text
