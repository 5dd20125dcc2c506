"""``run.py --prefetch``'s backbone half (its datasets half: tests/e2e/test_tasks_run.py): the backbone's tokenizer
and weights are read through the same loaders a run uses, so a later offline run finds them; the tiny encoder has
nothing to fetch."""

from __future__ import annotations

import pytest

from mtft.config.schema import ModelSection
from mtft.core.errors import ConfigError
from mtft.data.prefetch import prefetch_backbone
from tests.helpers.tiny_bert import corpus_lines, tiny_bert, wordpiece_tokenizer


def test_a_backbone_folder_is_read_as_a_run_reads_it(tmp_path):
    folder = tiny_bert(tmp_path / "bert", wordpiece_tokenizer(tmp_path / "vocab", corpus_lines("en")))
    echoed: list[str] = []
    prefetch_backbone(ModelSection(backbone=str(folder)), 64, 0, echoed.append)
    assert echoed == [f"cached model {folder}"]


def test_the_tiny_encoder_has_nothing_to_fetch():
    echoed: list[str] = []
    prefetch_backbone(ModelSection(backbone="tiny"), 64, 0, echoed.append)
    assert echoed == []


def test_a_backbone_that_does_not_load_is_one_error_and_nothing_echoed(tmp_path):
    (tmp_path / "empty").mkdir()
    echoed: list[str] = []
    with pytest.raises(ConfigError, match="empty"):
        prefetch_backbone(ModelSection(backbone=str(tmp_path / "empty")), 64, 0, echoed.append)
    assert echoed == []
