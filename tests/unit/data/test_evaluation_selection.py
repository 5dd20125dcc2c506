"""Selecting and preparing data to evaluate a finished run (``run.py evaluate``): nothing is trained, so what
concerns training only -- ``source_languages``, the training splits -- neither refuses the evaluated languages nor
is required; a task's sources are the evaluated languages the run trained on, the others its targets."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from mtft.core.errors import ConfigError, DataError
from mtft.data.selection import select_tasks, trained_languages
from mtft.evaluation.majority import majority_baselines
from tests.helpers.data import XNLI, make_config, prepare_for, tokenizer_factory, validation_only_copy

TRAINED = {"xnli": ["en", "de"]}  # what a run of XNLI (source_languages [en, de]) trained on


def evaluated(languages: list[str]):
    return make_config(tasks=[{**XNLI, "languages": languages}])


def test_a_runs_trained_languages_are_its_own_configs_sources():
    run = make_config(tasks=[XNLI])
    assert trained_languages(run.data, run.evaluation.split) == TRAINED
    run = make_config(tasks=[{**XNLI, "source_languages": None, "protocol": "zero_shot"}])
    assert trained_languages(run.data, run.evaluation.split) == {"xnli": ["en"]}


def test_evaluation_may_drop_a_source_that_training_must_evaluate():
    config = evaluated(["en", "sw"])
    with pytest.raises(ConfigError, match=r"source language\(s\) de not in its languages \[en, sw\]"):
        select_tasks(config.data, config.evaluation.split)  # a run that trains: refused as before
    (chosen,) = select_tasks(config.data, config.evaluation.split, TRAINED)
    assert chosen.evaluating and chosen.target_languages() == ["sw"]  # en a source, sw a target
    assert [(split, lang) for split, lang, _ in chosen.refs("validation")] == [
        ("validation", "en"),
        ("validation", "sw"),
    ]


def test_evaluating_no_trained_language_makes_every_language_a_target():
    config = evaluated(["ar", "sw"])
    (chosen,) = select_tasks(config.data, config.evaluation.split, TRAINED)
    assert chosen.target_languages() == ["ar", "sw"]
    # a task the run did not train: no sources either
    (chosen,) = select_tasks(config.data, config.evaluation.split, {})
    assert chosen.target_languages() == ["ar", "sw"]


def test_a_language_the_task_file_does_not_declare_is_evaluated_as_a_target():
    config = evaluated(["en", "xx"])
    with pytest.raises(ConfigError, match="has no language"):
        select_tasks(config.data, config.evaluation.split)  # a run that trains on its declared languages only
    (chosen,) = select_tasks(config.data, config.evaluation.split, TRAINED)
    assert chosen.target_languages() == ["xx"]
    assert chosen.task.dataset_ref("validation", "xx", chosen.protocol).name == "xx"  # the data says if it has it


def test_evaluation_still_refuses_what_concerns_evaluation():
    config = evaluated(["en", "xx"])
    with pytest.raises(ConfigError, match=r"no 'dev' split to evaluate its target language\(s\) xx"):
        select_tasks(config.data, "dev", TRAINED)  # the evaluation split, which every evaluated language needs


def test_prepared_for_evaluation_nothing_is_trained_and_the_baseline_reads_the_runs_training_labels():
    data = prepare_for(evaluated(["en", "sw"]), tokenizer_factory, TRAINED)
    td = data.tasks["xnli"]
    assert data.train_units == [] and td.train == {} and td.dev == {}
    assert sorted(td.eval) == ["en", "sw"] and td.targets == ["sw"]
    assert sorted(td.raw_train) == ["de", "en"]  # the run's training labels, both of them, for the baseline
    assert data.objective_names == ["xnli/en", "xnli/de"] and data.eval_objective == {("xnli", "en"): 0}
    assert {"xnli/en/majority_accuracy", "xnli/sw/majority_accuracy"} <= set(majority_baselines(data))


def test_evaluation_only_data_needs_no_training_split(tmp_path: Path, caplog):
    folder = validation_only_copy(Path("tasks/xnli/fixtures/xnli"), tmp_path / "xnli")
    assert not list(folder.rglob("train*")) and "split: train" not in (folder / "README.md").read_text()
    xnli = {**XNLI, "languages": ["en", "sw"], "source_languages": ["en"]}
    config = make_config(tasks=[xnli], sources={"facebook/xnli": str(folder)})
    with pytest.raises(DataError, match="cannot load"):
        prepare_for(config, tokenizer_factory)  # a run that trains needs its training splits
    logger = logging.getLogger("mtft")
    logger.addHandler(caplog.handler)  # the "mtft" logger may not propagate (run.py's console set-up)
    try:
        data = prepare_for(config, tokenizer_factory, TRAINED)
    finally:
        logger.removeHandler(caplog.handler)
    td = data.tasks["xnli"]
    assert sorted(td.eval) == ["en", "sw"] and td.raw_train == {} and data.train_units == []
    assert "task 'xnli': no majority-class baseline" in caplog.text
    assert majority_baselines(data) == {}  # said absent, not made up
