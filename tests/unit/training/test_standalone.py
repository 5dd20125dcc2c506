"""A run folder stands alone: its config records local paths absolute (names stay names), it keeps copies of its
task definitions (data paths absolute, a plug-in module beside), a finished run reads its tasks from those copies,
and a resume whose task files changed meanwhile is refused."""

from __future__ import annotations

import os

import pytest
import yaml

from mtft.config import load_config
from mtft.core.errors import ConfigError
from mtft.runs import read_run_config
from mtft.training.rundir import create_run_dir
from mtft.training.setup import check_output_dir
from mtft.training.standalone import absolute_paths, task_copies
from tests.helpers.launch import REPO

TASK = """task: topic
head: sequence_classification
languages: [en, de]
text_columns: [text]
label_names: [a, b]
data:
  train: {path: json, data_files: "data/{language}/train.jsonl", split: train}
  validation: {path: here, data_files: "{language}.jsonl", split: train}
  test: {path: json, data_files: ["https://example.org/{language}.jsonl"], split: train}
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A user's folder, the working directory: a task folder of theirs, a local dataset folder, a DeepSpeed file."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_tasks").mkdir()
    (tmp_path / "my_tasks" / "topic.yaml").write_text(TASK)
    (tmp_path / "here").mkdir()
    (tmp_path / "ds.json").write_text("{}")
    return tmp_path


def config_in(project, *overrides):
    return load_config(
        REPO / "configs/demo.yaml",
        [
            "run.output_dir=runs/r",
            "data.tasks=[{name: topic}, {name: xnli, languages: [en]}]",
            "data.task_dirs=[my_tasks]",
            "data.sources.facebook/xnli=data/{name}/{split}.jsonl",
            "corpus.path=here",
            "forgetting.retrieval.path=org/parallel",
            *overrides,
        ],
    )


def test_local_paths_become_absolute_and_names_stay_names(project):
    config = absolute_paths(config_in(project, "training.deepspeed_config=ds.json", "model.backbone=here"))
    assert config.data.task_dirs == [str(project / "my_tasks")]
    assert config.data.sources["facebook/xnli"] == str(project / "data/{name}/{split}.jsonl")
    assert config.corpus.path == str(project / "here")
    assert config.forgetting.retrieval.path == "org/parallel"  # a Hub id: nothing of that name here
    assert config.training.deepspeed_config == str(project / "ds.json")
    assert config.model.backbone == str(project / "here")
    named = absolute_paths(config_in(project, "model.backbone=tiny", "training.deepspeed_config=zero2"))
    assert (named.model.backbone, named.training.deepspeed_config) == ("tiny", "zero2")
    assert absolute_paths(config) == config  # idempotent


def test_task_copies_hold_the_definition_with_absolute_data_paths_and_the_plugin_module(project):
    (project / "my_tasks" / "topic.yaml").write_text(TASK.replace("head:", "class: mine:Topic\nhead:"))
    (project / "my_tasks" / "mine.py").write_text("# the user's plug-in\n")
    copies = task_copies(config_in(project))
    assert set(copies) == {"topic/topic.yaml", "topic/mine.py", "xnli/xnli.yaml"}
    data = yaml.safe_load(copies["topic/topic.yaml"])["data"]
    assert data["train"]["data_files"] == str(project / "data/{language}/train.jsonl")  # a packaged builder's
    assert data["validation"] == {"path": str(project / "here"), "data_files": "{language}.jsonl", "split": "train"}
    assert data["test"]["data_files"] == ["https://example.org/{language}.jsonl"]  # a URL is no local path
    assert copies["topic/mine.py"] == "# the user's plug-in\n"
    built_in = yaml.safe_load(copies["xnli/xnli.yaml"])
    assert built_in["task"] == "xnli" and built_in["data"]["validation"]["path"] == "facebook/xnli"


def test_a_finished_run_reads_its_own_task_copies_from_any_folder(project, tmp_path_factory):
    config = config_in(project)
    create_run_dir(config)
    run = project / "runs" / "r"
    assert (run / "tasks" / "topic" / "topic.yaml").is_file()
    (project / "my_tasks" / "topic.yaml").unlink()  # the user's task folder is gone
    os.chdir(tmp_path_factory.mktemp("elsewhere"))
    read = read_run_config(run)
    assert read.data.task_dirs == [str(run / "tasks")]
    assert read.data.sources["facebook/xnli"] == str(project / "data/{name}/{split}.jsonl")
    extra = tmp_path_factory.mktemp("more_tasks")
    added = read_run_config(run, [f"data.task_dirs=[{project / 'my_tasks'}, {extra}]"])
    assert added.data.task_dirs == [str(run / "tasks"), str(extra)]  # the folder it trained with is its copies


def test_a_resume_whose_task_file_changed_is_refused(project):
    config = config_in(project, "run.resume=true")
    create_run_dir(config)
    assert check_output_dir(config) is None  # unchanged: resumes (no checkpoint yet)
    (project / "my_tasks" / "topic.yaml").write_text(TASK.replace("[a, b]", "[b, a]"))
    with pytest.raises(ConfigError, match=r"task definitions changed since it started \(topic/topic\.yaml"):
        check_output_dir(config)


def test_a_resume_from_another_folder_reads_other_files_and_is_refused(project, tmp_path_factory):
    config = config_in(project, "run.resume=true", f"run.output_dir={project / 'runs/r'}")
    create_run_dir(config)
    os.chdir(tmp_path_factory.mktemp("elsewhere"))
    with pytest.raises(ConfigError, match=r"the config differs at .*data\.sources"):
        check_output_dir(config_in(project, "run.resume=true", f"run.output_dir={project / 'runs/r'}"))
