"""Which heads MHLoss (stability.heads > 1) accepts, and the one line it refuses the others with."""

from __future__ import annotations

import pytest

from mtft.core.errors import ConfigError
from mtft.training.setup import check_mhloss

POOLED = {"a": "sequence_classification", "b": "regression", "c": "multiple_choice", "d": "candidate_scoring"}


def test_pooled_heads_are_accepted_and_one_head_accepts_every_kind():
    check_mhloss(50, POOLED)
    check_mhloss(1, {**POOLED, "ner": "token_classification", "qa": "question_answering"})


@pytest.mark.parametrize("kind", ["token_classification", "question_answering"])
def test_token_and_span_heads_are_refused_in_one_line(kind):
    with pytest.raises(ConfigError) as error:
        check_mhloss(2, {**POOLED, "t": kind})
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"stability.heads=2 (MHLoss) supports pooled heads only; task 't' has a {kind} head")
