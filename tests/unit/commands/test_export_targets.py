"""Where an export goes (never inside the run folder) and its adapters' target_modules: PEFT's own name
matching, never a checkpoint's pooler."""

from __future__ import annotations

import re

import pytest

from mtft.commands.export import export_run, without_pooler
from mtft.core.errors import CheckpointError


@pytest.mark.parametrize(
    "run, out",
    [
        (".", "checkpoints/step-00000009"),  # would become the run's newest checkpoint
        (".", "predictions/adapters"),
        (".", "adapters"),
        ("best", "checkpoints/step-00000009"),  # --run names a checkpoint of the run
    ],
)
def test_an_export_inside_the_run_folder_is_refused_before_anything_is_written(tmp_path, run, out):
    run_dir = tmp_path / "run"
    (run_dir / "best").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("run: {}\n")
    (run_dir / "best" / "model.safetensors").write_bytes(b"")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(CheckpointError, match=r"is inside the run folder .*run, which the run owns"):
        export_run(run_dir / run, run_dir / out)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_names_match_as_peft_matches_them_but_not_under_the_pooler():
    pattern = without_pooler(["query", "key", "value", "dense"])
    adapted = ["encoder.layer.0.attention.self.query", "encoder.layer.5.output.dense", "dense", "a.key"]
    left = ["pooler.dense", "encoder.layer.0.output.densey", "encoder.layer.0.intermediate.dense_act"]
    assert all(re.fullmatch(pattern, name) for name in adapted)
    assert not any(re.fullmatch(pattern, name) for name in left)


def test_a_users_regex_is_kept():
    assert without_pooler(r".*\.(query|value)") == r".*\.(query|value)"


@pytest.mark.parametrize(
    "config, named",
    [
        ({"model": {"backbone": "org/model"}}, True),  # a Hub id (or a folder of the user's) as the run used it
        ({"model": {"backbone": "tiny"}}, False),
        ({"model": {"backbone": "multilingual-e5-small"}}, False),  # converted into the user's cache by mtft
        ({"model": {"backbone": "org/model", "vocabulary": "used"}}, False),  # cut to the run's pieces
        ({"model": {"backbone": "org/model", "weights": "random"}}, False),
        ({"model": {"backbone": "org/model"}, "stability": {"surt": {"enabled": True}}}, False),  # re-trained
    ],
)
def test_the_export_names_the_base_only_where_it_is_the_backbone_as_named(config, named):
    """Otherwise it writes the base the adapters sit on into the export (base/), with the run's tokenizer."""
    from mtft.commands.export import named_as_configured
    from mtft.config import validate_config

    tasks = {"data": {"tasks": [{"name": "xnli", "languages": ["en"]}]}}
    assert named_as_configured(validate_config({**tasks, **config}, "test")) == named
