"""The cache shared by pre-training and SURT (mtft.training.stage_cache): one key recipe in which the launch's
process count and ZeRO stage change the key of both stages' entries, and one fill protocol (read when complete,
fill once otherwise, never twice for runs that share an entry)."""

from __future__ import annotations

import threading

import pytest

from mtft.config import load_config
from mtft.core.atomic import MARKER
from mtft.core.distributed import ProcessInfo
from mtft.training.pretrain import prelude_key
from mtft.training.stage_cache import from_cache_or_fill, stage_key
from mtft.training.surt import surt_key
from tests.helpers.launch import REPO

DEMO = REPO / "configs" / "demo.yaml"
ZERO = {stage: f"training.deepspeed_config={REPO / f'configs/deepspeed/zero{stage}.json'}" for stage in (0, 1, 2, 3)}
ONE = ProcessInfo(rank=0, world_size=1, local_rank=0)


def test_the_key_differs_with_the_world_size_and_the_zero_stage():
    config = load_config(DEMO, [])
    keys = {stage_key(config, world, {"a": 1}) for world in (1, 2, 4, 8)}
    keys |= {stage_key(load_config(DEMO, [ZERO[stage]]), 2, {"a": 1}) for stage in (1, 2, 3)}
    assert len(keys) == 7
    assert stage_key(config, 2, {"a": 1}) == stage_key(load_config(DEMO, []), 2, {"a": 1})  # and is stable
    assert stage_key(config, 2, {"a": 1}) != stage_key(config, 2, {"a": 2})


@pytest.mark.parametrize("which", ["pretrain", "surt"])
def test_both_stages_key_on_the_launch(which):
    """pretrain.before_finetune's and SURT's entries both follow the process count and the ZeRO stage (issue 17:
    a two-process run filled the one-process entry with half the steps)."""
    overrides = ["stability.surt.enabled=true"] if which == "surt" else []

    def key(world: int, *more: str) -> str:
        config = load_config(DEMO, [*overrides, *more])
        if which == "pretrain":
            return prelude_key(config, ["en", "de"], world_size=world)
        return surt_key(config, ["some task text"], world)

    assert key(1) == key(1)
    assert len({key(1), key(2), key(4), key(2, ZERO[2])}) == 4


def test_a_complete_entry_is_read_and_not_filled(tmp_path):
    folder = tmp_path / "entry"
    folder.mkdir()
    (folder / MARKER).write_text("{}")
    from_cache_or_fill(folder, ONE, "thing", lambda: pytest.fail("filled a complete entry"))


def test_runs_sharing_an_entry_fill_it_once(tmp_path):
    """Two runs started together: one fills under the entry's lock, the other waits and then reads it."""
    folder, fills, started = tmp_path / "entry", [], threading.Event()

    def fill():
        fills.append(1)
        started.set()
        threading.Event().wait(0.3)  # the other run arrives while this one trains
        folder.mkdir()
        (folder / MARKER).write_text("{}")

    first = threading.Thread(target=from_cache_or_fill, args=(folder, ONE, "thing", fill))
    first.start()
    started.wait(5)
    from_cache_or_fill(folder, ONE, "thing", fill)
    first.join(5)
    assert fills == [1] and (folder / MARKER).is_file()
