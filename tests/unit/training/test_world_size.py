"""How many processes saved a checkpoint: its record, else (older checkpoints) one RNG file per rank."""

from __future__ import annotations

import json

from mtft.training.checkpoint import saved_world_size


def test_recorded_world_size_wins(tmp_path):
    (tmp_path / "trainer_state.json").write_text(json.dumps({"step": 4, "world_size": 3}))
    (tmp_path / "rng-rank0.safetensors").write_bytes(b"")
    assert saved_world_size(tmp_path) == 3


def test_older_checkpoints_count_their_rank_files(tmp_path):
    (tmp_path / "trainer_state.json").write_text(json.dumps({"step": 4}))
    for rank in range(2):
        (tmp_path / f"rng-rank{rank}.safetensors").write_bytes(b"")
    assert saved_world_size(tmp_path) == 2
