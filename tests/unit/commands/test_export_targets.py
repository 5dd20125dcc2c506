"""The exported adapters' target_modules: PEFT's own name matching, never a checkpoint's pooler."""

from __future__ import annotations

import re

from mtft.commands.export import without_pooler


def test_names_match_as_peft_matches_them_but_not_under_the_pooler():
    pattern = without_pooler(["query", "key", "value", "dense"])
    adapted = ["encoder.layer.0.attention.self.query", "encoder.layer.5.output.dense", "dense", "a.key"]
    left = ["pooler.dense", "encoder.layer.0.output.densey", "encoder.layer.0.intermediate.dense_act"]
    assert all(re.fullmatch(pattern, name) for name in adapted)
    assert not any(re.fullmatch(pattern, name) for name in left)


def test_a_users_regex_is_kept():
    assert without_pooler(r".*\.(query|value)") == r".*\.(query|value)"
