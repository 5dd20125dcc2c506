"""A wheel carries the built-in tasks: ``pip install .`` (not editable) must find XNLI without a checkout.

The wheel is built from a copy of the sources (tests/helpers/checkout_wheel.py).
"""

from __future__ import annotations

import configparser
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers.checkout_wheel import build_wheel
from tests.helpers.launch import REPO


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("build"))


def test_setup_cfg_lists_every_package():
    """``find:`` cannot add mtft.builtin_tasks (the tasks/ folder), so setup.cfg lists the packages by hand."""
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    listed = set(config["options"]["packages"].split())
    packages = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "mtft").rglob("__init__.py")}
    assert packages | {"mtft.builtin_tasks"} == listed, (
        f"setup.cfg [options] packages: add {sorted(packages - listed)}, remove "
        f"{sorted(listed - packages - {'mtft.builtin_tasks'})}"
    )


def test_wheel_holds_the_built_in_tasks_and_every_package(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    task_files = {
        f"mtft/builtin_tasks/{p.relative_to(REPO / 'tasks').as_posix()}"
        for p in (REPO / "tasks").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    expected = {
        "README.md",
        "xnli/xnli.yaml",
        "glue/cola.yaml",
        "xnli/fixtures/xnli/README.md",
        "xnli/fixtures/xnli/en/test.jsonl",
    }
    assert {f"mtft/builtin_tasks/{name}" for name in expected} <= names
    assert task_files <= names, sorted(task_files - names)[:5]
    assert not any(name.startswith("tasks/") for name in names), "the tasks must install inside mtft/, not top level"
    packages = {p.relative_to(REPO).as_posix() for p in (REPO / "mtft").rglob("__init__.py")}
    assert packages <= names, f"packages missing from setup.cfg [options] packages: {sorted(packages - names)}"
    for data in ("mtft/fixtures/data", "mtft/fixtures/real_world"):  # corpora, the world of real words' lexicons
        files = {p.relative_to(REPO).as_posix() for p in (REPO / data).rglob("*") if p.is_file()}
        files = {f for f in files if not f.endswith(".py") and "__pycache__" not in f}
        assert files <= names, sorted(files - names)[:5]


def test_installed_wheel_discovers_the_built_in_tasks(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
    )
    script = (
        "import json, mtft; from mtft.tasks import discover_tasks; "
        "from mtft.tasks.registry import builtin_task_dir; "
        "print(json.dumps([mtft.__file__, str(builtin_task_dir()), sorted(discover_tasks())]))"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    module, folder, names = json.loads(result.stdout.splitlines()[-1])
    assert Path(module).is_relative_to(target) and Path(folder) == target / "mtft" / "builtin_tasks"
    assert {"xnli", "wikiann", "tydiqa", "glue_cola", "glue_mrpc", "superglue_record"} <= set(names)
