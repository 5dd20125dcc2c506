"""Resuming compares the interrupted run's config as this version reads it: a run written before the adapter options
became typed (one flat section) or before a key was added resumes; a real difference is still refused."""

from __future__ import annotations

import pytest
import yaml

from mtft.config import load_config
from mtft.config.load import config_to_yaml
from mtft.core.errors import ConfigError
from mtft.training.setup import check_output_dir
from tests.helpers.launch import REPO


def interrupted_run(tmp_path, edit) -> object:
    overrides = [
        f"run.output_dir={tmp_path / 'run'}",
        "run.resume=true",
        "model.adapter.method=lora",
        "weighting.method=mean",
    ]
    config = load_config(REPO / "configs/demo.yaml", overrides)
    folder = tmp_path / "run"
    folder.mkdir()
    saved = yaml.safe_load(config_to_yaml(config))
    edit(saved)
    (folder / "config.yaml").write_text(yaml.safe_dump(saved))
    return config


def test_a_run_written_before_typed_adapter_options_and_new_keys_resumes(tmp_path):
    def older(saved):
        # the one flat section of earlier versions wrote every adapter key, Multi-LoRA's beside LoRA's
        saved["model"]["adapter"].update(granularity="task", init_a="peft")
        del saved["training"]["gradient_checkpointing"]  # keys added since
        del saved["gradients"]["budget_gb"]
        del saved["gradients"]["update"]

    config = interrupted_run(tmp_path, older)
    assert check_output_dir(config) is None  # no checkpoint yet: resumes from the start, no refusal


def test_a_real_difference_is_refused(tmp_path):
    config = interrupted_run(tmp_path, lambda saved: saved["training"].update(max_steps=7))
    with pytest.raises(ConfigError, match=r"the config differs at training\.max_steps"):
        check_output_dir(config)
