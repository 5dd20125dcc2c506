"""L_p sharded over two gloo ranks (the monitors' and pre-training's measurement): each rank runs its share of the
batches and both get one process's float64 sums bit for bit, with batch counts two ranks cannot split evenly."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch

from mtft.forgetting.corpus import build_eval_set
from mtft.forgetting.mlm import lp_per_language
from tests.helpers.forgetting import corpus_config, tiny_mlm
from tests.helpers.launch import run_ranks

WORLD = 2
BATCH = 7  # 20 held-out texts a language: 3 batches, so rank 1 runs one padding pass


def _worker(rank: int, port: int, folder: str, eval_set) -> None:
    torch.set_num_threads(1)
    mlm, _ = tiny_mlm(Path(folder), dtype=torch.float32)
    assert {len(eval_set.batches(lang, BATCH)) for lang in eval_set.languages} == {3}
    alone = lp_per_language(mlm, eval_set, BATCH, "cpu")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        forward, passes = mlm.forward, []

        def counted(**batch):
            passes.append(1)
            return forward(**batch)

        mlm.forward = counted
        shared = lp_per_language(mlm, eval_set, BATCH, "cpu", shard=True)
        assert len(passes) == 2 * 2  # ⌈3/2⌉ passes a language on each rank, not 3
        assert shared == alone  # the same float64 sums, added in the same order
        assert lp_per_language(mlm, eval_set, BATCH, "cpu") == alone  # unsharded on a process group: unchanged
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.timeout(180)
def test_two_gloo_ranks_share_the_lp_batches_and_get_one_process_sums(tmp_path):
    _, tok = tiny_mlm(tmp_path)  # trains the tokenizer once, before the ranks read it
    # built here: transformers' seeded masking collator refuses to run in a worker process outside a DataLoader
    config = corpus_config()
    eval_set = build_eval_set(config.corpus, config.data, tok, ["en", "de"], 32)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    run_ranks(_worker, (port, str(tmp_path), eval_set), WORLD)
