"""Task plug-ins run code: only the plug-ins of the tasks a run looks up are imported."""

from __future__ import annotations

import json

import pytest

from mtft.core.errors import ConfigError
from mtft.tasks import discover_tasks, get_task

CODE = "open({marker!r}, 'w').close()\nfrom mtft.tasks import Task\n\nclass {name}(Task):\n    pass\n"


def plugin_task(folder, task, module, marker):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{module}.py").write_text(CODE.format(marker=str(marker), name="Custom"))
    spec = {
        "task": task,
        "class": f"{module}:Custom",
        "languages": ["en"],
        "label_names": ["neg", "pos"],
        "data": {"train": {"path": "my/data", "split": "train"}},
    }
    (folder / f"{task}.yaml").write_text(json.dumps(spec))


def test_an_unused_plugin_is_never_imported(tmp_path):
    plugin_task(tmp_path / "tasks", "used", "used_code", tmp_path / "used_ran")
    plugin_task(tmp_path / "tasks", "unused", "unused_code", tmp_path / "unused_ran")
    available = discover_tasks([tmp_path / "tasks"])
    assert {"used", "unused"} <= set(available)
    assert not (tmp_path / "used_ran").exists() and not (tmp_path / "unused_ran").exists()
    assert type(get_task("used", available)).__name__ == "Custom"
    assert (tmp_path / "used_ran").exists() and not (tmp_path / "unused_ran").exists()


def test_a_plugin_that_fails_on_import_names_its_task_file(tmp_path):
    folder = tmp_path / "tasks"
    plugin_task(folder, "broken", "broken_code", tmp_path / "ran")
    (folder / "broken_code.py").write_text("raise RuntimeError('bug in the plug-in')\n")
    available = discover_tasks([folder])
    with pytest.raises(ConfigError, match=r"broken.yaml: class 'broken_code:Custom': .* RuntimeError: bug in the"):
        get_task("broken", available)


@pytest.mark.parametrize(
    "field, value, message",
    [("task", "../x", "task: '../x' is not a valid name"), ("languages", ["/abs"], "languages: '/abs' is not a valid")],
)
def test_task_files_name_valid_tasks_and_languages(tmp_path, field, value, message):
    plugin_task(tmp_path / "tasks", "t", "t_code", tmp_path / "ran")
    path = tmp_path / "tasks" / "t.yaml"
    path.write_text(json.dumps({**json.loads(path.read_text()), field: value}))
    with pytest.raises(ConfigError, match=message):
        discover_tasks([tmp_path / "tasks"])
    assert not (tmp_path / "ran").exists()
