"""data.leave_out: S^i, each training (task, language) split less k seeded examples, batched as S less those rows."""

from __future__ import annotations

import numpy as np
import pytest

from mtft.config.load import validate_config
from mtft.core.errors import ConfigError, DataError
from mtft.data.leave_out import kept_order, removed_ids
from mtft.data.pipeline import task_training_texts
from mtft.data.sampler import MultiObjectiveSampler
from tests.helpers.data import XNLI_SOURCES, make_config, prepare_for, tokenizer_factory

XNLI = {"name": "xnli", "languages": ["en", "de"], "protocol": "in_language", "max_train_examples": 40}


def pairs(dataset) -> list[tuple[str, str]]:
    return list(zip(dataset["premise"], dataset["hypothesis"]))


def prepared(**data):
    return prepare_for(make_config(tasks=[XNLI], **data), tokenizer_factory)


@pytest.mark.parametrize(("leave", "k"), [({"count": 1}, 1), ({"count": 5}, 5), ({"fraction": 0.1}, 4)])
def test_exactly_k_examples_go_and_the_rest_keep_their_order(leave, k):
    whole, reduced = prepared().tasks["xnli"], prepared(leave_out=leave).tasks["xnli"]
    for lang in ("en", "de"):
        full_rows = pairs(whole.raw_train[lang])
        kept = pairs(reduced.trained_raw(lang))
        assert len(kept) == 40 - k and len(reduced.left_out[lang]) == k
        gone = set(reduced.left_out[lang].tolist())
        assert kept == [row for i, row in enumerate(full_rows) if i not in gone]  # S's order, less S^i's removal
        encoded, encoded_whole = reduced.train[lang], whole.train[lang]
        assert len(encoded) == 40 - k and reduced.train_whole[lang] == 40
        assert encoded["input_ids"] == [encoded_whole["input_ids"][int(j)] for j in reduced.train_kept[lang]]
        assert f"({k} example(s), seed 0)" in reduced.origin["train", lang]


def test_the_removal_follows_its_own_seed_not_run_seed_and_differs_by_language():
    def removed(seed=0, run_seed=None):
        config = make_config(tasks=[XNLI], leave_out={"count": 3, "seed": seed})
        if run_seed is not None:
            config = config.model_copy(update={"run": config.run.model_copy(update={"seed": run_seed})})
        td = prepare_for(config, tokenizer_factory).tasks["xnli"]
        return {lang: td.left_out[lang].tolist() for lang in ("en", "de")}

    first = removed()
    assert first == removed() == removed(run_seed=99)  # deterministic, whatever the fine-tuning seed
    assert first != removed(seed=1)
    assert first["en"] != first["de"]  # each (task, language) split draws its own


def test_leave_out_applies_after_the_dev_split():
    td = prepared(dev_split=0.1, leave_out={"count": 2}).tasks["xnli"]
    assert len(td.raw_dev["en"]) == 4 and len(td.trained_raw("en")) == 34 and len(td.train["en"]) == 34
    dev = set(pairs(td.raw_dev["en"]))
    assert not dev & set(pairs(td.raw_train["en"]))  # the removal draws from the remaining training examples


def test_surt_text_leaves_the_removed_examples_out():
    removed = make_config(tasks=[{**XNLI, "languages": ["en"]}], leave_out={"count": 3})
    texts = task_training_texts(removed.data, removed.evaluation.split)
    config = make_config(tasks=[{**XNLI, "languages": ["en"]}])
    whole = task_training_texts(config.data, config.evaluation.split)
    assert len(texts) == len(whole) - 3 * 2  # premise and hypothesis of each removed example


def test_sampler_visits_s_order_with_the_removed_rows_skipped():
    n, kept = 12, np.array([0, 1, 3, 4, 5, 7, 8, 9, 10, 11])  # rows 2 and 6 removed
    whole = MultiObjectiveSampler([n], [1.0], batch_size=4, seed=3)
    reduced = MultiObjectiveSampler([len(kept)], [1.0], batch_size=4, seed=3, kept=[kept], full_sizes=[n])
    sequence = [row for _ in range(3) for _, row in whole.next_batch()]  # 12 rows: S's first pass
    reduced_sequence = [int(kept[row]) for _ in range(3) for _, row in reduced.next_batch()][:10]
    assert reduced_sequence == [row for row in sequence if row not in (2, 6)]
    assert sorted(reduced_sequence) == kept.tolist()  # one pass of S^i: every kept row once


def test_kept_order_renumbers_to_the_reduced_split():
    assert kept_order(np.array([4, 0, 2, 1, 3]), np.array([1, 3, 4])).tolist() == [2, 0, 1]


def test_a_sampler_without_kept_rows_is_unchanged():
    plain = MultiObjectiveSampler([7, 5], [0.5, 0.5], batch_size=6, seed=1)
    layout = MultiObjectiveSampler([7, 5], [0.5, 0.5], batch_size=6, seed=1, kept=[None, None], full_sizes=[7, 5])
    assert [plain.next_batch() for _ in range(5)] == [layout.next_batch() for _ in range(5)]


@pytest.mark.parametrize(
    ("leave", "message"),
    [
        ({"count": 1, "fraction": 0.1}, "give exactly one of count: N and fraction: F"),
        ({"seed": 1}, "give exactly one of count: N and fraction: F"),
        ({"count": 0}, "greater than or equal to 1"),
        ({"fraction": 1.0}, "less than 1"),
        ({"count": 1, "draws": 2}, "unknown key"),
    ],
)
def test_bad_leave_out_is_one_config_error(leave, message):
    with pytest.raises(ConfigError, match=message) as error:
        validate_config({"data": {"sources": XNLI_SOURCES, "tasks": [XNLI], "leave_out": leave}}, source="test")
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(("leave", "removes"), [({"count": 40}, "40 of 40"), ({"fraction": 0.01}, "0 of 40")])
def test_removing_none_or_all_is_one_data_error(leave, removes):
    with pytest.raises(DataError, match=f"data.leave_out .* removes {removes} example"):
        prepared(leave_out=leave)


def test_an_id_shared_by_two_examples_cannot_be_removed_alone():
    assert removed_ids(["a", "b", "c"], np.array([1]), "here") == {"b"}
    assert removed_ids(["a", "b", "a"], np.array([1]), "here") == {"b"}  # a duplicate elsewhere is no matter
    with pytest.raises(DataError, match="here: data.leave_out needs unique example ids, but id 'a' names 2 examples"):
        removed_ids(["a", "b", "a"], np.array([2]), "here")
