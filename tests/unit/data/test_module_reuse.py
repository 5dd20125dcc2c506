"""``one_module_per_dataset``: within a run's loading, a dataset's card is read once for all its configs and splits
(``datasets`` would read and resolve it again for each), and the splits are those ``datasets`` loads alone."""

from __future__ import annotations

import datasets.load as loader
import pytest

from mtft.data.sources import load_split, one_module_per_dataset
from mtft.tasks.base import DatasetRef

XNLI = "tasks/xnli/fixtures/xnli"
REFS = [DatasetRef(path=XNLI, name=name, split=split) for name in ("en", "de") for split in ("train", "validation")]


@pytest.fixture
def factory_calls(monkeypatch):
    calls = []
    factory = loader.dataset_module_factory
    monkeypatch.setattr(loader, "dataset_module_factory", lambda *a, **k: calls.append(a[0]) or factory(*a, **k))
    return calls


def test_a_dataset_is_read_once_for_all_its_configs_and_splits(tmp_path, factory_calls):
    alone = [load_split(ref, {}, str(tmp_path)) for ref in REFS]
    assert len(factory_calls) == len(REFS)  # datasets by itself: once per config and split
    factory_calls.clear()
    with one_module_per_dataset():
        shared = [load_split(ref, {}, str(tmp_path)) for ref in REFS]
    assert len(factory_calls) == 1
    for one, other in zip(alone, shared):
        assert one.features == other.features and one.to_dict() == other.to_dict()
    assert [len(split) for split in shared] == [len(split) for split in alone] and len({len(s) for s in shared}) == 2


def test_outside_the_block_every_load_reads_afresh_even_after_an_error(tmp_path, factory_calls):
    with pytest.raises(RuntimeError, match="stop"), one_module_per_dataset():
        load_split(REFS[0], {}, str(tmp_path))
        raise RuntimeError("stop")
    assert len(factory_calls) == 1
    load_split(REFS[0], {}, str(tmp_path))
    load_split(REFS[1], {}, str(tmp_path))
    assert len(factory_calls) == 3


def test_the_pipeline_and_prefetch_read_each_dataset_once(tmp_path, monkeypatch, factory_calls):
    """``prepare_data`` (a run's tasks, ``run.py evaluate``) and ``--prefetch`` load many configs and splits of one
    dataset: each reads the card once (XNLI in two languages: one module for facebook/xnli's folder)."""
    from mtft.data.prefetch import prefetch_datasets
    from tests.helpers.data import make_config, prepare_for, tokenizer_factory

    monkeypatch.setenv("MTFT_CACHE", str(tmp_path))
    config = make_config(cache_dir=str(tmp_path))
    prepare_for(config, tokenizer_factory)
    folders = [call for call in factory_calls if str(call).endswith("tasks/xnli/fixtures/xnli")]
    assert len(folders) == 1 and len(factory_calls) == len(set(map(str, factory_calls)))
    factory_calls.clear()
    fetched = prefetch_datasets(config.data, config.evaluation.split, echo=lambda line: None)
    assert fetched >= 4  # train and validation in two languages, at least
    assert len(factory_calls) == len(set(map(str, factory_calls)))
