"""Templates in the user's strings (mtft.core.templates): every setting that holds one refuses, when it is read, a
format spec, an unknown placeholder, an attribute, an index, a conversion and a lone brace -- one line naming the
setting and the allowed placeholders -- and takes a good value; filling never runs ``str.format``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtft.config.load import load_config
from mtft.core.errors import ConfigError
from mtft.core.templates import TemplateError, check_template, fill_template
from mtft.tasks.declarative import load_task_file
from tests.helpers.launch import REPO
from tests.helpers.runs import BASE_CONFIG


def override(key: str):
    def apply(value: str, tmp_path: Path) -> None:
        load_config(REPO / BASE_CONFIG, [f"{key}={json.dumps(value)}"])

    return apply


def task_data_name(value: str, tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    data = {"train": {"path": "my/t", "name": value, "split": "train"}}
    spec = {"task": "t", "languages": ["en"], "label_names": ["a", "b"], "metrics": ["accuracy"], "data": data}
    path.write_text(json.dumps(spec))
    load_task_file(path)


def copa_setting(key: str):
    def apply(value: str, tmp_path: Path) -> None:
        copa = load_task_file(REPO / "tasks/super_glue/copa.yaml")
        copa.configured({key: value}, "data.tasks.0")

    return apply


# setting: (how to set it, its placeholder, a fragment of the error line naming the setting, the allowed words)
SETTINGS = {
    "retrieval.name": (override("forgetting.retrieval.name"), "language", "forgetting.retrieval.name", "{language}"),
    "corpus.name": (override("corpus.name"), "language", "corpus.name", "{language}"),
    "data.sources": (override("data.sources.x/y"), "split", "data.sources: ['x/y']", "{name}, {split}"),
    "task-file data": (task_data_name, "language", "t.yaml: data.train.name", "{language}"),
    "context_template": (copa_setting("context_template"), "premise", "settings.context_template", "plain {name}"),
    "choice_template": (copa_setting("choice_template"), "choice", "settings.choice_template", "plain {name}"),
}
# fault: (the template, given the setting's placeholder f; what the error line says; None: accepted)
FAULTS = {
    "width spec": ("{{{f}:>999999999}}", "format spec is not allowed"),
    "unknown field": ("{{{f}}}-{{nope}}", "unknown placeholder {nope}"),
    "attribute": ("{{{f}.__class__}}", "is not a plain name"),
    "index": ("{{{f}[0]}}", "is not a plain name"),
    "conversion": ("{{{f}!r}}", "conversion is not allowed"),
    "lone brace": ("{{{f}}}-{{", "Single '{'"),
    "good value": ("x-{{{f}}}-{{{{literal}}}}", None),
}
# the column templates admit any plain name: their columns are checked against each split
OPEN = {("context_template", "unknown field"), ("choice_template", "unknown field")}


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_each_template_setting_refuses_each_fault_in_one_line(setting, fault, tmp_path):
    apply, field, names, allowed = SETTINGS[setting]
    template, expect = FAULTS[fault]
    value = template.format(f=field)
    if expect is None or (setting, fault) in OPEN:
        apply(value, tmp_path)
        return
    with pytest.raises(ConfigError) as caught:
        apply(value, tmp_path)
    message = str(caught.value)
    assert "\n" not in message and len(message) < 600, message
    assert expect in message and names in message and allowed in message, message


@pytest.mark.parametrize(
    "value, fields, expect",
    [
        ("{language}", {"language": "en"}, "en"),
        ("{target}-{source}", {"source": "eng", "target": "deu"}, "deu-eng"),
        ("d/{name}/{split}.jsonl", {"name": "en", "split": "train"}, "d/en/train.jsonl"),
        ("{{literal}} {language}{language}", {"language": "de"}, "{literal} dede"),
        ("no placeholder", {"language": "en"}, "no placeholder"),
        ("{premise}?", {"premise": "{question}", "question": "x"}, "{question}?"),  # a value is never re-read
    ],
)
def test_fill_substitutes_plain_fields_only(value, fields, expect):
    assert fill_template(value, fields) == expect


@pytest.mark.parametrize(
    "value, allowed", [("{language:>999999999}", {"language"}), ("{source}", {"language"}), ("{0}", None)]
)
def test_fill_refuses_what_check_refuses(value, allowed):
    with pytest.raises(TemplateError, match="allowed"):
        fill_template(value, dict.fromkeys(allowed or (), "en"), "a.setting")
    with pytest.raises(TemplateError, match=r"^a\.setting: "):
        check_template(value, allowed, "a.setting")


def test_retrieval_name_holds_one_layout():
    load_config(REPO / BASE_CONFIG, ["forgetting.retrieval.name='{target}-{source}'"])
    for value in ("{language}-{source}", "{source}", "tatoeba"):
        with pytest.raises(ConfigError, match="must contain '{language}'"):
            load_config(REPO / BASE_CONFIG, [f"forgetting.retrieval.name='{value}'"])
