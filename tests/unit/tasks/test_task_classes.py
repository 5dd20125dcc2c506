"""``class:`` in a task file: a module beside the file or an importable module; never a path outside the folder."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from mtft.core.errors import ConfigError
from mtft.tasks import discover_tasks
from mtft.tasks.classification import ClassificationTask
from mtft.tasks.declarative import load_task_file
from mtft.tasks.registry import builtin_task_dir
from mtft.tasks.superglue import RecordTask

TASK_CODE = "from mtft.tasks import Task\n\nclass {name}(Task):\n    pass\n"


def task_file(folder: Path, cls: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "sentiment.yaml"
    path.write_text(
        json.dumps(
            {
                "task": "sentiment",
                "class": cls,
                "languages": ["en"],
                "label_names": ["neg", "pos"],
                "metrics": ["accuracy"],
                "data": {"train": {"path": "my/sentiment", "split": "train"}},
            }
        )
    )
    return path


def test_class_beside_the_task_file(tmp_path):
    path = task_file(tmp_path / "tasks", "custom:CustomTask")
    (path.parent / "custom.py").write_text(TASK_CODE.format(name="CustomTask"))
    assert type(load_task_file(path)).__name__ == "CustomTask"


def test_class_from_an_importable_module(tmp_path):
    task = load_task_file(task_file(tmp_path / "tasks", "mtft.tasks.classification:ClassificationTask"))
    assert type(task) is ClassificationTask


@pytest.mark.parametrize(
    "reference",
    [
        "../../outside:OutsideTask",
        "/abs/outside:OutsideTask",
        "..outside:X",
        "sub/outside:OutsideTask",
        "outside.py:OutsideTask",
        "outside:",
        "outside",
        "outside:Outside-Task",
        3,
    ],
)
def test_a_name_that_is_not_a_module_is_refused_before_anything_runs(tmp_path, reference):
    """The module part must be a plain identifier (beside the file) or a dotted path: ``../..`` cannot reach code
    outside the task folder. The code below would leave a marker if it ran."""
    outside = tmp_path / "outside.py"
    marker = tmp_path / "ran"
    outside.write_text(f"open({str(marker)!r}, 'w').close()\n" + TASK_CODE.format(name="OutsideTask"))
    path = task_file(tmp_path / "a" / "tasks", reference)
    refused = r"task file .*sentiment.yaml: class .*(must be '<module>:<Class>'|No module named)"
    with pytest.raises(ConfigError, match=refused):
        load_task_file(path)
    assert not marker.exists() and not any(name.rsplit(".", 1)[-1] == "outside" for name in sys.modules)


def test_missing_modules_and_wrong_classes_are_refused(tmp_path):
    folder = tmp_path / "tasks"
    with pytest.raises(ConfigError, match=r"sentiment.yaml: class 'custom:CustomTask': custom.py not found beside"):
        load_task_file(task_file(folder, "custom:CustomTask"))
    with pytest.raises(ConfigError, match=r"'mtft.nothing_here:X': cannot import 'mtft.nothing_here' \(No module"):
        load_task_file(task_file(folder, "mtft.nothing_here:X"))
    with pytest.raises(
        ConfigError,
        match=r"'mtft.tasks.kinds:build_head': <function build_head .*> is not a subclass of mtft.tasks.base.T",
    ):
        load_task_file(task_file(folder, "mtft.tasks.kinds:build_head"))


def test_built_in_tasks_name_library_classes_and_ship_no_code():
    tasks = discover_tasks()
    assert type(tasks["glue_mrpc"]) is ClassificationTask and type(tasks["superglue_record"]) is RecordTask
    assert not list(builtin_task_dir().rglob("*.py"))


def test_the_encoding_key_follows_the_class_source_read_once_per_class(tmp_path, monkeypatch):
    """The encoding cache's key holds a digest of the task class's source: an edited class re-encodes. The source
    is read once per class (``inspect.getsource`` parses the whole module), not once per split encoded."""
    import inspect

    reads = []
    getsource = inspect.getsource
    monkeypatch.setattr(inspect, "getsource", lambda obj: reads.append(obj) or getsource(obj))
    keys = []
    for folder, body in (("a", "    pass\n"), ("b", "    pass  # edited\n")):
        path = task_file(tmp_path / folder / "tasks", "custom:CustomTask")
        (path.parent / "custom.py").write_text("from mtft.tasks import Task\n\nclass CustomTask(Task):\n" + body)
        task = load_task_file(path)
        keys += [task.encoding_key(), task.encoding_key(), task.encoding_key()]
    assert keys[0] == keys[1] == keys[2] and keys[3] == keys[4] == keys[5] and keys[0] != keys[3]
    assert [cls.__name__ for cls in reads].count("CustomTask") == 2  # one read per class, not per call
