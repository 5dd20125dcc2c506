"""Names that become paths are checked, and a path built from names never leaves its root."""

from __future__ import annotations

import pytest

from mtft.core.errors import ConfigError, echo
from mtft.core.paths import check_name, inside, name_problem
from mtft.core.safe_yaml import load_yaml, read_text


@pytest.mark.parametrize("name", ["xnli", "en", "zh-Hans", "glue_mnli.m", "a1"])
def test_valid_names(name):
    assert name_problem(name) is None and check_name(name, "x") == name


@pytest.mark.parametrize(
    "name", ["", "../x", "..", "a..b", "/abs", "a/b", "a\\b", ".hidden", "-x", "a b", 5, "x" * 101]
)
def test_invalid_names(name):
    with pytest.raises(ConfigError, match="^task: "):
        check_name(name, "task")


@pytest.mark.parametrize("parts", [("..", "x"), ("/etc", "x"), ("a/../../b",), ("",), (".",), ("a\0b",)])
def test_inside_refuses_to_leave_its_root(tmp_path, parts):
    with pytest.raises(ConfigError):
        inside(tmp_path / "run", *parts)


def test_inside_builds_the_path(tmp_path):
    assert inside(tmp_path, "predictions", "validation", "xnli", "en.jsonl") == (
        tmp_path / "predictions/validation/xnli/en.jsonl"
    )


def test_aliases_are_refused_with_the_line():
    with pytest.raises(ConfigError, match=r"c.yaml: YAML anchors and aliases .* \(line 2\)"):
        load_yaml("x: 1\na: &a [1, 2]\nb: *a\n", "c.yaml")
    assert load_yaml("a: [1, 2]\n", "c.yaml") == {"a": [1, 2]}


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="is a directory"):
        read_text(tmp_path, "config file")
    (tmp_path / "c.yaml").write_bytes(b"a: 1\nb: \xff\n")
    with pytest.raises(ConfigError, match=r"not UTF-8 text \(byte 8, line 2\)"):
        read_text(tmp_path / "c.yaml", "config file")


def test_echo_is_bounded():
    assert len(echo("x" * 10**6)) < 250 and echo("ab") == "'ab'"
