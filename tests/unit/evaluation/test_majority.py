"""The majority-class baseline: the most frequent training label predicted for every example, scored by the task's
own metrics on hand-computed cases, per language and macro-averaged; none for kinds without a class."""

from __future__ import annotations

import os
from pathlib import Path

import datasets
import pytest
from sklearn.metrics import f1_score

from mtft.config import validate_config
from mtft.data.pipeline import DEV, PreparedData, TaskData
from mtft.evaluation.majority import majority_baselines
from mtft.models.tokenizer import tiny_tokenizer
from mtft.tasks import discover_tasks
from mtft.tasks.base import Task
from mtft.tasks.classification import ClassificationTask
from tests.helpers.data import prepare_for
from tests.helpers.launch import REPO

NAMES = ["a", "b"]


def split(labels: list[int]) -> datasets.Dataset:
    return datasets.Dataset.from_dict({"text": [f"x{i}" for i in range(len(labels))], "label": labels})


def task_data(task: Task, train: dict[str, list[int]], evaluated: dict[str, list[int]], **extra) -> TaskData:
    td = TaskData(task, "in_language", list(evaluated), label_names=NAMES, **extra)
    td.raw_train = {lang: split(labels) for lang, labels in train.items()}
    td.raw_eval = {lang: split(labels) for lang, labels in evaluated.items()}
    td.origin = {**{("train", k): f"train {k}" for k in train}, **{("validation", k): f"eval {k}" for k in evaluated}}
    return td


def prepared(**tasks: TaskData) -> PreparedData:
    return PreparedData(tasks, tokenizer=None, train_units=[], unit_objective=[], objective_names=[])


def classification(metrics, **settings) -> Task:
    cls = ClassificationTask if settings else Task
    return cls(name="t", languages=["en"], text_columns=("text",), metrics=metrics, settings=settings)


@pytest.mark.parametrize(
    "metrics, settings, train, evaluated, expected",
    [
        # train [a, a, b]: the majority is a; eval [a, b, b]: right once in three
        (("accuracy", "mcc"), {}, [0, 0, 1], [0, 1, 1], {"accuracy": 1 / 3, "mcc": 0.0}),
        # F1 of the positive class: never predicted -> 0; predicted everywhere -> 2·(1/3)·1 / (1/3 + 1) = 1/2
        (("f1", "accuracy"), {"positive_label": "b"}, [0, 0, 1], [0, 1, 1], {"f1": 0.0, "accuracy": 1 / 3}),
        (("f1",), {"positive_label": "a"}, [0, 0, 1], [0, 1, 1], {"f1": 0.5}),
        # a tie goes to the label listed first (a)
        (("accuracy",), {}, [1, 0], [1, 1, 1, 0], {"accuracy": 0.25}),
        # macro F1 over the classes present (sklearn): a scores 2·(1/4)/(1/4 + 1) = 0.4, b 0 -> 0.2
        (("macro_f1",), {}, [1, 1, 0], [1, 0, 0, 0], {"macro_f1": 0.2}),
    ],
)
def test_the_constant_majority_prediction_scored_by_the_tasks_metrics(metrics, settings, train, evaluated, expected):
    data = prepared(t=task_data(classification(metrics, **settings), {"en": train}, {"en": evaluated}))
    got = majority_baselines(data)
    want = {f"t/en/majority_{k}": v for k, v in expected.items()} | {f"t/majority_{k}": v for k, v in expected.items()}
    assert got == pytest.approx(want, abs=1e-12) and set(got) == set(want)


def test_languages_pool_their_training_labels_and_the_task_averages_over_languages():
    # en trains [a, b, b], de [a, a]: pooled a=3, b=2 -> a everywhere (de's own majority is a, en's b)
    td = task_data(
        classification(("accuracy",)), {"en": [0, 1, 1], "de": [0, 0]}, {"en": [0, 1, 1], "de": [0, 0, 1, 1]}
    )
    got = majority_baselines(prepared(t=td))
    assert got == pytest.approx(
        {"t/en/majority_accuracy": 1 / 3, "t/de/majority_accuracy": 0.5, "t/majority_accuracy": 5 / 12}
    )


def test_the_dev_set_is_scored_against_the_training_labels_left_after_the_hold_out():
    td = task_data(classification(("accuracy",)), {"en": [1, 1, 0]}, {"en": [0, 0, 0]})
    td.raw_dev = {"en": split([0, 0, 0, 1])}  # held out of training: its labels do not count
    td.dev = dict(td.raw_dev)  # (its encoded rows: only which languages have a dev set matters here)
    td.origin[DEV, "en"] = "dev en"
    data = prepared(t=td)
    assert majority_baselines(data, dev=True) == {"t/en/majority_accuracy": 0.25, "t/majority_accuracy": 0.25}
    assert majority_baselines(data) == {"t/en/majority_accuracy": 0.0, "t/majority_accuracy": 0.0}


def test_the_examples_data_leave_out_removed_take_no_part_in_the_majority():
    # train [b, b, a, a, a]: a is the majority; removing two of the a's (rows 2 and 3) leaves b
    td = task_data(classification(("accuracy",)), {"en": [1, 1, 0, 0, 0]}, {"en": [1, 1, 0]})
    assert majority_baselines(prepared(t=td))["t/en/majority_accuracy"] == pytest.approx(1 / 3)
    td.left_out = {"en": [2, 3]}
    assert majority_baselines(prepared(t=td))["t/en/majority_accuracy"] == pytest.approx(2 / 3)


def test_kinds_without_a_majority_class_get_no_baseline():
    tasks = discover_tasks()
    for name in ("glue_stsb", "wikiann", "tydiqa", "superglue_record"):  # regression, tags, spans, candidates
        assert tasks[name].majority_prediction([split([0, 1])], NAMES, "w") is None, name
    for name in ("glue_cola", "superglue_copa", "superglue_multirc", "xnli"):  # classes, choices, options
        assert tasks[name].majority_prediction([split([0, 1, 1])], NAMES, "w") == "b", name


SOURCES = {
    "nyu-mll/glue": str(REPO / "tasks/glue/fixtures/glue"),
    "aps/super_glue": str(REPO / "tasks/super_glue/fixtures/super_glue"),
}


def test_on_the_fixtures_cola_scores_mcc_0_mrpc_its_f1_and_axg_borrows_the_rte_heads_training_labels():
    names = ("glue_cola", "glue_mrpc", "glue_stsb", "superglue_rte", "superglue_axg")
    raw = {
        "data": {"sources": SOURCES, "tasks": [{"name": n} for n in names], "max_length": 32},
        "model": {"tiny": {"vocab_size": 300}},
    }
    data = prepare_for(
        validate_config(raw, source="test"), lambda texts: tiny_tokenizer(texts, 300, Path(os.environ["MTFT_CACHE"]))
    )
    got = majority_baselines(data)
    assert got["glue_cola/majority_mcc"] == 0.0 and not any(k.startswith("glue_stsb/") for k in got)

    def constant(task: str, owner: str) -> tuple[list[str], str]:
        """The gold labels of ``task`` and the majority label of ``owner``'s training split."""
        td, trained = data.tasks[task], data.tasks[owner]
        train = [trained.label_names[i] for i in trained.raw_train["en"]["label"]]
        return [td.label_names[i] for i in td.raw_eval["en"]["label"]], max(trained.label_names, key=train.count)

    gold, majority = constant("glue_mrpc", "glue_mrpc")
    assert got["glue_mrpc/majority_accuracy"] == pytest.approx(gold.count(majority) / len(gold))
    assert got["glue_mrpc/majority_f1"] == pytest.approx(
        f1_score(gold, [majority] * len(gold), labels=["equivalent"], average="micro", zero_division=0)
    )
    gold, majority = constant("superglue_axg", "superglue_rte")  # evaluation-only: no training split of its own
    assert data.tasks["superglue_axg"].raw_train == {}
    assert got["superglue_axg/en/majority_accuracy"] == pytest.approx(gold.count(majority) / len(gold))
    assert got["superglue_axg/majority_gender_parity"] == 1.0  # a constant prediction is always gender-parallel
