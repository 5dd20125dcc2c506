"""Source and target languages per task (data.tasks.N.source_languages): targets never reach a training batch,
selection reads the sources' validation unless told otherwise, and the macros split into source, target and gap."""

from __future__ import annotations

from statistics import mean

import numpy as np
import pytest

from mtft.config import validate_config
from mtft.config.schema import EvaluationSection
from mtft.core.errors import ConfigError
from mtft.data.pipeline import PreparedData, TaskData
from mtft.data.sampler import MultiObjectiveSampler, mixing_probabilities
from mtft.data.selection import check_tasks, select_tasks, selection_metric
from mtft.evaluation.evaluate import add_macro_averages
from mtft.reporting.report import Report, TaskTable
from mtft.tasks.base import Task
from tests.helpers.data import LANGUAGES, SOURCES, TARGETS, XNLI, make_config, prepare_for, tokenizer_factory


def config_with(task: dict | None = None, **evaluation):
    config = make_config(tasks=[task or XNLI])
    if evaluation:
        config = config.model_copy(update={"evaluation": config.evaluation.model_copy(update=evaluation)})
    return config


def test_sources_train_and_every_language_is_evaluated():
    config = config_with()
    (chosen,) = select_tasks(config.data, config.evaluation.split)
    assert (chosen.training_languages(), chosen.target_languages()) == (SOURCES, TARGETS)
    assert [(split, lang) for split, lang, _ in chosen.refs("validation")] == [
        *[("train", lang) for lang in SOURCES],
        *[("validation", lang) for lang in LANGUAGES],
    ]


@pytest.mark.parametrize(
    "protocol, sources, targets",
    [("zero_shot", ["en"], ["de", "ar", "zh"]), ("in_language", LANGUAGES, [])],
)
def test_without_source_languages_the_protocol_decides_as_before(protocol, sources, targets):
    config = config_with({**XNLI, "source_languages": None, "protocol": protocol})
    (chosen,) = select_tasks(config.data, config.evaluation.split)
    assert (chosen.training_languages(), chosen.target_languages()) == (sources, targets)


@pytest.fixture(scope="module")
def prepared() -> PreparedData:
    return prepare_for(make_config(tasks=[XNLI], dev_split=0.2), tokenizer_factory)


def test_no_target_split_is_loaded_for_training(prepared):
    td = prepared.tasks["xnli"]
    assert sorted(td.raw_train) == sorted(td.train) == sorted(td.raw_dev) == sorted(SOURCES)
    assert sorted(td.raw_eval) == sorted(LANGUAGES) and td.targets == TARGETS
    assert not [key for key in td.origin if key[0] != "validation" and key[1] in TARGETS]
    assert [o.key for o in prepared.train_units] == ["xnli/en", "xnli/de"]


def test_the_sampler_never_draws_a_target_row(prepared):
    """The trainer's sampler (mtft.training.trainer.Run._sampler) over the run's training units: 200 batches of 32
    draw only source rows, and every source is drawn."""
    sizes = [len(prepared.train_dataset(u)) for u in range(len(prepared.train_units))]
    kept, whole = prepared.train_layout()
    sampler = MultiObjectiveSampler(sizes, mixing_probabilities(sizes, "uniform"), 32, 0, kept, whole)
    drawn = np.array([pair for _ in range(200) for pair in sampler.next_batch()])
    assert {prepared.train_units[unit].language for unit in drawn[:, 0]} == set(SOURCES)
    assert all(row < sizes[unit] for unit, row in drawn)  # rows of the source splits


@pytest.mark.parametrize(
    "change, message",
    [
        ({"source_languages": ["en", "xx"]}, "source_languages has no language(s) xx of the task"),
        (
            {"languages": ["en", "ar"], "source_languages": ["en", "de"]},
            "source language(s) de not in its languages [en, ar]",
        ),
        (
            {"protocol": "zero_shot", "source_languages": ["en", "de"]},
            "source language 'de' has no training data under protocol 'zero_shot' (nyu-mll/multi_nli split train "
            "is en only)",
        ),
    ],
)
def test_bad_sources_are_one_config_error(change, message):
    config = config_with({**XNLI, **change})
    with pytest.raises(ConfigError) as error:
        select_tasks(config.data, config.evaluation.split)
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize(
    "sources, message", [([], "must list at least one language"), (["en", "en"], "lists a language twice")]
)
def test_an_empty_or_repeated_source_list_is_refused_by_the_schema(sources, message):
    with pytest.raises(ConfigError, match=rf"data.tasks.0.source_languages.*{message}"):
        config_with({**XNLI, "source_languages": sources})


def test_a_target_without_the_evaluation_split_is_refused():
    tydiqa = {"name": "tydiqa", "languages": ["en", "sw"], "source_languages": ["en"]}
    config = validate_config({"data": {"tasks": [tydiqa]}, "evaluation": {"split": "test"}}, source="test")
    with pytest.raises(ConfigError, match=r"task 'tydiqa' has no 'test' split to evaluate its target language\(s\) sw"):
        select_tasks(config.data, config.evaluation.split)


def evaluation(key: str, select_on: str = "source") -> EvaluationSection:
    return EvaluationSection(metric_for_best=key, select_on=select_on)


def pick(key: str, select_on: str = "source", dev: bool = False, targets=TARGETS, languages=LANGUAGES) -> str:
    return selection_metric(evaluation(key, select_on), {"xnli": languages}, {"xnli": targets}, dev)


def test_selection_reads_the_source_macro_by_default():
    assert pick("xnli/accuracy") == "xnli/source_accuracy"
    assert pick("xnli/de/accuracy") == "xnli/de/accuracy"
    assert pick("xnli/accuracy", "all") == "xnli/accuracy"
    assert pick("xnli/accuracy", "target") == "xnli/target_accuracy"
    assert pick("xnli/ar/accuracy", "target") == "xnli/ar/accuracy"
    # no targets (in-language), or the dev set (held out of the training splits): the key as it is
    assert pick("xnli/accuracy", targets=[]) == pick("xnli/accuracy", dev=True) == "xnli/accuracy"


@pytest.mark.parametrize(
    "key, select_on, extra, message",
    [
        ("xnli/ar/accuracy", "source", {}, "reads 'ar', a target language of task 'xnli'"),
        ("xnli/en/accuracy", "target", {}, "reads 'en', a source language of task 'xnli'"),
        ("xnli/accuracy", "target", {"targets": []}, "target languages, and it has none"),
        ("xnli/accuracy", "target", {"dev": True}, "the dev set (data.dev_split) holds source languages only"),
        ("xnli/accuracy", "source", {"languages": TARGETS}, "evaluates none of its source languages"),
    ],
)
def test_selection_on_targets_must_be_asked_for(key, select_on, extra, message):
    with pytest.raises(ConfigError) as error:
        pick(key, select_on, **extra)
    assert message in str(error.value)


def test_the_preflight_refuses_a_target_metric_for_best():
    on_source = config_with(metric_for_best="xnli/zh/accuracy")
    with pytest.raises(ConfigError, match="a target language of task 'xnli'"):
        check_tasks(on_source.data, on_source.evaluation)
    on_target = config_with(metric_for_best="xnli/zh/accuracy", select_on="target")
    check_tasks(on_target.data, on_target.evaluation)


def scored(targets: list[str], dev: bool = False) -> dict[str, float]:
    task = Task(name="xnli", languages=LANGUAGES, metrics=("accuracy", "f1"))
    td = TaskData(task, "in_language", LANGUAGES, targets=targets)
    td.dev = dict.fromkeys(SOURCES) if dev else {}
    data = PreparedData({"xnli": td}, None, [], [], [])
    values = {"en": 0.9, "de": 0.8, "ar": 0.5, "zh": 0.4}
    metrics = {f"xnli/{lang}/{m}": v - (m == "f1") * 0.1 for lang, v in values.items() for m in ("accuracy", "f1")}
    metrics.update({f"xnli/{lang}/majority_accuracy": 0.3 for lang in LANGUAGES})
    add_macro_averages(metrics, data, dev)
    add_macro_averages(metrics, data, dev, "majority_")
    return metrics


def test_source_and_target_macros_and_the_transfer_gap():
    metrics = scored(TARGETS)
    assert metrics["xnli/accuracy"] == pytest.approx(mean([0.9, 0.8, 0.5, 0.4]))
    assert metrics["xnli/source_accuracy"] == pytest.approx(0.85)
    assert metrics["xnli/target_accuracy"] == pytest.approx(0.45)
    assert metrics["xnli/transfer_gap_accuracy"] == pytest.approx(0.40)
    assert metrics["xnli/source_f1"] == pytest.approx(0.75) and metrics["xnli/transfer_gap_f1"] == pytest.approx(0.4)
    # the baseline's split, named as mtft.study.failure expects for xnli/target_accuracy; no gap of a baseline
    assert metrics["xnli/majority_target_accuracy"] == pytest.approx(0.3)
    assert "xnli/transfer_gap_majority_accuracy" not in metrics and "xnli/majority_transfer_gap_accuracy" not in metrics


def test_without_targets_no_split_is_written():
    for metrics in (scored([]), scored(TARGETS, dev=True)):
        assert not [k for k in metrics if "source_" in k or "target_" in k or "gap" in k]


def test_the_report_marks_each_language_and_gives_the_macros_and_the_gap(tmp_path):
    metrics = scored(TARGETS)

    def report(targets):
        return Report("t", [], metrics, {"xnli": TaskTable(["accuracy"], LANGUAGES, targets)}).write(tmp_path)

    text = report(TARGETS).read_text()
    for row in ("| en (source) | 0.9000 |", "| zh (target) | 0.4000 |", "| source macro | 0.8500 |"):
        assert row in text
    assert "| target macro | 0.4500 |" in text and "| transfer gap (source − target) | 0.4000 |" in text
    plain = report([]).read_text()
    assert "| en | 0.9000 |" in plain and "source" not in plain and "target" not in plain


def test_the_plan_of_the_shipped_multi_source_config_checks_and_prints_its_split(capsys, monkeypatch):
    """``run.py --plan`` on configs/xtreme_multi_source.yaml, offline: Hub ids are described, never loaded."""
    from mtft.cli import main
    from tests.helpers.launch import REPO

    monkeypatch.chdir(REPO)
    assert main(["--config", "configs/xtreme_multi_source.yaml", "--plan"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "tydiqa (in_language): sources en, fi, id, ru; targets ar, bn, ko, sw, te" in lines
    assert "  train facebook/xnli (config {language}) split train: en, de, fr, es, ru" in lines
    assert lines[-1] == (
        "model selection: metric_for_best xnli/accuracy reads xnli/source_accuracy on validation "
        "(evaluation.select_on=source)"
    )
    with pytest.raises(ConfigError, match="'zh', a target language"):
        main(["--config", "configs/xtreme_multi_source.yaml", "--plan", "evaluation.metric_for_best=xnli/zh/accuracy"])
