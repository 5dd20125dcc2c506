"""data.dev_split: a seeded fraction of each training (task, language) split is held out as the dev set."""

from __future__ import annotations

import pytest

from mtft.core.errors import ConfigError, DataError
from mtft.data.pipeline import DEV
from mtft.data.selection import check_metric_for_best, select_tasks
from tests.helpers.data import make_config, prepare_for, tokenizer_factory

XNLI = {"name": "xnli", "languages": ["en", "de"], "protocol": "in_language", "max_train_examples": 40}


def pairs(dataset) -> list[tuple[str, str]]:
    return list(zip(dataset["premise"], dataset["hypothesis"]))


def test_the_dev_set_is_a_seeded_tenth_of_each_training_split_and_disjoint_from_it():
    whole = prepare_for(make_config(tasks=[XNLI]), tokenizer_factory).tasks["xnli"]
    split = prepare_for(make_config(tasks=[XNLI], dev_split=0.1), tokenizer_factory).tasks["xnli"]
    for lang in ("en", "de"):
        train, dev = pairs(split.raw_train[lang]), pairs(split.raw_dev[lang])
        assert (len(train), len(dev)) == (36, 4)
        assert sorted(train + dev) == sorted(pairs(whole.raw_train[lang]))  # a partition of the training split
        assert len(split.train[lang]) == 36 and len(split.dev[lang]) == 4  # encoded too
        assert "dev 0.1 held out (seed 0)" in split.origin[DEV, lang]
    assert pairs(split.raw_eval["en"]) == pairs(whole.raw_eval["en"])  # evaluation.split, the test set, untouched
    assert not whole.raw_dev and not whole.dev


def test_the_split_follows_dev_split_seed_not_run_seed():
    def dev_of(**raw):
        config = make_config(tasks=[XNLI], dev_split=0.25, **raw.pop("data", {}))
        config = config.model_copy(update={"run": config.run.model_copy(update=raw)}) if raw else config
        return pairs(prepare_for(config, tokenizer_factory).tasks["xnli"].raw_dev["en"])

    assert dev_of() == dev_of(seed=123)
    assert dev_of() != dev_of(data={"dev_split_seed": 1})


def test_the_dev_set_is_what_a_dev_evaluation_scores():
    data = prepare_for(make_config(tasks=[XNLI], dev_split=0.1), tokenizer_factory)
    assert [o.key for o in data.eval_objectives(dev=True)] == ["xnli/en", "xnli/de"]
    zero_shot = {**XNLI, "languages": ["en", "de", "zh"], "protocol": "zero_shot", "max_train_examples": 30}
    data = prepare_for(make_config(tasks=[zero_shot], dev_split=0.1), tokenizer_factory)
    assert [o.key for o in data.eval_objectives(dev=True)] == ["xnli/en"]  # zero-shot languages have no dev set
    assert [o.key for o in data.eval_objectives()] == ["xnli/en", "xnli/de", "xnli/zh"]


def test_metric_for_best_must_be_a_metric_of_the_dev_set():
    zero_shot = {**XNLI, "languages": ["en", "de"], "protocol": "zero_shot"}
    config = make_config(tasks=[zero_shot], dev_split=0.1)
    selected = select_tasks(config.data, config.evaluation.split)

    def with_metric(key: str):
        return config.evaluation.model_copy(update={"metric_for_best": key})

    for good in ("xnli/accuracy", "xnli/en/accuracy"):
        check_metric_for_best(config.data, with_metric(good), selected)
    with pytest.raises(ConfigError, match="not a metric of the dev set"):  # de is evaluated, never trained on
        check_metric_for_best(config.data, with_metric("xnli/de/accuracy"), selected)
    whole = make_config(tasks=[zero_shot])
    selected = select_tasks(whole.data, whole.evaluation.split)

    def on_de(select_on: str):
        return whole.evaluation.model_copy(update={"metric_for_best": "xnli/de/accuracy", "select_on": select_on})

    check_metric_for_best(whole.data, on_de("target"), selected)  # without the dev set: a target, when asked for
    with pytest.raises(ConfigError, match="'de', a target language"):
        check_metric_for_best(whole.data, on_de("source"), selected)


def test_too_few_examples_to_split_is_one_data_error():
    tiny = {**XNLI, "languages": ["en"], "max_train_examples": 1}
    with pytest.raises(DataError, match=r"data.dev_split=0.1 cannot split 1 example\(s\)"):
        prepare_for(make_config(tasks=[tiny], dev_split=0.1), tokenizer_factory)
