"""An installed mtft at home outside the checkout: the wheel in a fresh virtual environment, its ``mtft`` command run
from an empty folder of the user's own -- a run of a tiny config with the user's data and no file of the checkout
(the default DeepSpeed stage is built in), then ``mtft predict`` on it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.checkout_wheel import build_wheel
from tests.helpers.launch import REPO, clean_env
from tests.helpers.runs import read_jsonl

ROWS = 24


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A virtual environment with the wheel of this checkout (its dependencies from the running interpreter's
    site-packages: --system-site-packages; mtft itself only from the wheel, built from a copy of the sources)."""
    root = tmp_path_factory.mktemp("installed")
    wheel = build_wheel(root)
    env = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(env)], check=True)
    subprocess.run([str(env / "bin" / "pip"), "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True)
    return env


def fixture_rows(language: str, split: str) -> str:
    lines = (REPO / f"tasks/xnli/fixtures/xnli/{language}/{split}.jsonl").read_text(encoding="utf-8").splitlines()
    return "\n".join(lines[:ROWS]) + "\n"


# a task of the user's own, in a folder of theirs, its data files relative to where they work
TOPIC = """task: topic
head: sequence_classification
languages: [en, de]
default_protocol: in_language
text_columns: [premise, hypothesis]
label_names: [entailment, neutral, contradiction]
data:
  train: {path: json, data_files: "data/{language}/train.jsonl", split: train}
  validation: {path: json, data_files: "data/{language}/validation.jsonl", split: train}
"""


def test_the_installed_command_trains_and_predicts_from_an_empty_folder(venv, tmp_path):
    """Trained from the user's folder; then used from another folder, by the run's path alone: predict, evaluate,
    export. Moving the run and editing the task file change nothing about it, and evaluating it on a language its
    task file does not declare is one override."""
    home = tmp_path / "my project"  # a user's folder, a space in its name
    for language in ("en", "de", "fr"):
        (home / "data" / language).mkdir(parents=True)
        for split in ("train", "validation"):
            (home / "data" / language / f"{split}.jsonl").write_text(fixture_rows(language, split), encoding="utf-8")
    (home / "my_tasks").mkdir()
    (home / "my_tasks" / "topic.yaml").write_text(TOPIC)
    config = {
        "run": {"name": "mine", "output_dir": "runs/mine"},
        "model": {"backbone": "tiny", "dropout": 0.0, "tiny": {"hidden_size": 32, "vocab_size": 200}},
        "data": {"tasks": [{"name": "topic"}], "task_dirs": ["my_tasks"], "max_length": 32},
        "training": {"max_steps": 3, "micro_batch_size": 8},
        "logging": {"progress_bar": False},
    }
    (home / "mine.yaml").write_text(json.dumps(config))  # JSON is YAML
    mtft = str(venv / "bin" / "mtft")
    # every package of the checkout's mtft imports from the wheel: one the wheel lacks would otherwise be found in
    # the checkout by its editable install's finder (the venv sees the system's site-packages)
    packages = sorted(".".join(p.relative_to(REPO).parent.parts) for p in (REPO / "mtft").rglob("__init__.py"))
    where = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            f"import importlib; [print(importlib.import_module(n).__file__) for n in {packages}]",
        ],
        cwd=home,
        capture_output=True,
        text=True,
    )
    assert where.returncode == 0, where.stderr[-2000:]
    files = where.stdout.split()
    assert len(files) == len(packages) and all(f.startswith(str(venv)) for f in files), [
        f for f in files if not f.startswith(str(venv))
    ]  # the wheel's mtft, not the checkout's
    env = clean_env(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1")

    def command(*argv: str, cwd: Path, fails: bool = False) -> subprocess.CompletedProcess:
        done = subprocess.run([mtft, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
        assert (done.returncode != 0) == fails, done.stderr[-3000:]
        return done

    command("train", "--config", "mine.yaml", cwd=home)
    run = home / "runs" / "mine"
    assert json.loads((run / "metrics.json").read_text())["step"] == 3
    saved = (run / "config.yaml").read_text()
    assert "zero0" in saved  # the built-in stage, no configs/ folder needed
    assert str(home / "my_tasks") in saved  # paths recorded absolute
    copy = yaml.safe_load((run / "tasks" / "topic" / "topic.yaml").read_text())  # the task as trained
    assert copy["data"]["train"]["data_files"] == str(home / "data" / "{language}" / "train.jsonl")  # absolute

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "new.jsonl").write_text(json.dumps({"id": 7, "premise": "a b", "hypothesis": "c"}) + "\n")
    command("predict", "--run", str(run), "--task", "topic", "--input", "new.jsonl", "--out", "p.jsonl", cwd=elsewhere)
    assert read_jsonl(elsewhere / "p.jsonl")[0]["id"] == 7
    command("evaluate", "--run", str(run), "--out", "before", cwd=elsewhere)
    command("export", "--run", str(run), "--out", "exported", cwd=elsewhere)
    assert (elsewhere / "exported" / "topic" / "head.safetensors").is_file()

    # the run moved to another folder, the user's task file edited (another language list, other label names):
    # the run is what it was
    run = run.rename(elsewhere / "moved run")
    (home / "my_tasks" / "topic.yaml").write_text(TOPIC.replace("[en, de]", "[en]").replace("entailment", "yes"))
    argv = ["--task", "topic", "--input", "new.jsonl", "--out", "p2.jsonl"]
    command("predict", "--run", str(run), *argv, cwd=elsewhere)
    assert read_jsonl(elsewhere / "p2.jsonl") == read_jsonl(elsewhere / "p.jsonl")
    command("evaluate", "--run", str(run), "--out", "after", cwd=elsewhere)
    before, after = (json.loads((elsewhere / f / "metrics.json").read_text()) for f in ("before", "after"))
    assert after == before and "topic/de/accuracy" in after
    predictions = "predictions/validation/topic/de.jsonl"
    assert read_jsonl(elsewhere / "after" / predictions) == read_jsonl(elsewhere / "before" / predictions)

    # a language the task file never declared, its data beside the others: one override
    command("evaluate", "--run", str(run), "--out", "fr", "data.tasks.0.languages=[en,fr]", cwd=elsewhere)
    french = json.loads((elsewhere / "fr" / "metrics.json").read_text())
    assert french["topic/en/accuracy"] == before["topic/en/accuracy"]
    assert french["topic/target_accuracy"] == french["topic/fr/accuracy"]  # fr: a target, the run never trained it
    # one without data: one line naming the file, nothing written
    refused = command(
        "evaluate", "--run", str(run), "--out", "sw", "data.tasks.0.languages=[sw]", cwd=elsewhere, fails=True
    )
    assert refused.stderr.count("\n") == 1 and "data/sw/validation.jsonl" in refused.stderr, refused.stderr
    assert not (elsewhere / "sw").exists()
