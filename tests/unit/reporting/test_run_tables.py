"""The run report's setup and objectives tables (mtft.reporting.run_tables), built from the run's config and
numbers without a run (issue 30: the report's tables in reporting/, not in the training loop)."""

from __future__ import annotations

from mtft.config import validate_config
from mtft.reporting.run_tables import objectives_table, setup_table


def test_the_setup_table_says_how_the_run_was_set_up():
    config = validate_config(
        {
            "data": {"tasks": [{"name": "xnli", "languages": ["en", "de"]}], "dev_split": 0.25},
            "weighting": {"method": "lfmlf", "options": {"floor": 0.1}},
            "gradients": {"metric": "optimizer"},
            "training": {"micro_batch_size": 4, "gradient_accumulation_steps": 2},
        },
        source="test",
    )
    rows = dict(setup_table(config, steps=7, processes=2, zero_stage=1, pretraining="1,024 tokens"))
    assert rows["weighting"] == "lfmlf over task_language (floor=0.1), Gram in the optimizer's metric"
    assert rows["backbone pre-training"] == "1,024 tokens"
    assert (rows["steps"], rows["processes"], rows["global batch"]) == ("7", "2", "16")
    assert rows["DeepSpeed"] == "zero0 (ZeRO stage 1)"  # the default: the built-in stage by name
    assert rows["dev split"] == "0.25 of each training split (seed 0)"
    plain = dict(setup_table(validate_config({"data": {"tasks": [{"name": "xnli"}]}}, source="test"), 1, 1, 0, None))
    assert "backbone pre-training" not in plain and "dev split" not in plain
    assert plain["weighting"] == "mean over task_language"


def test_the_objectives_table_has_a_row_per_training_unit():
    assert objectives_table(["xnli/en", "xnli/de"], [10, 30], [0.25, 0.75]) == [
        {"name": "xnli/en", "examples": 10, "probability": 0.25},
        {"name": "xnli/de", "examples": 30, "probability": 0.75},
    ]
