"""Short training runs with the stability methods of Fu, So & Collier (2023) turned on."""

from __future__ import annotations

import json
import math

from tests.helpers.launch import run_cli
from tests.helpers.runs import BASE_CONFIG, base_overrides, read_jsonl


def test_max_margin_regulariser_trains_and_logs_its_term(tmp_path):
    out = tmp_path / "mmr"
    overrides = base_overrides(
        out,
        20,
        **{
            "weighting.method": "mean",
            "weighting.options": {},
            "stability.mmr": 0.5,
            "logging.every_steps": 10,
            "evaluation.every_steps": 20,
            "checkpointing.every_steps": 20,
        },
    )
    result = run_cli("--config", BASE_CONFIG, *overrides)
    assert result.returncode == 0, result.stderr[-3000:]
    train = [e for e in read_jsonl(out / "metrics.jsonl") if e["kind"] == "train"]
    assert [e["step"] for e in train] == [10, 20]
    for row in train:
        # R = 1 / (1 + mean centre distance) lies in (0, 1], and the logged per-objective losses include α·R
        assert 0 < row["mmr/xnli"] <= 1, row
        assert all(math.isfinite(v) for k, v in row.items() if k.startswith("loss/"))
    assert train[-1]["loss"] < train[0]["loss"]
    assert json.loads((out / "metrics.json").read_text())["step"] == 20
