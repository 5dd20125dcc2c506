"""The typed config: every shipped YAML validates; bad keys, types and values are refused clearly."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mtft.config import RunConfig, load_config
from mtft.config.load import iter_options, parse_override, set_dotted
from mtft.core.errors import ConfigError
from tests.helpers.launch import REPO, run_cli

SHIPPED = sorted(p for p in (REPO / "configs").rglob("*.yaml") if "studies" not in p.parts)  # studies: tests/unit/study


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(REPO)))
def test_every_shipped_config_validates(path: Path, monkeypatch):
    monkeypatch.chdir(REPO)
    config = load_config(path)
    assert isinstance(config, RunConfig)
    assert Path(config.training.deepspeed_config).is_file()
    for local in config.data.sources.values():
        assert Path(local).exists(), local


def test_shipped_configs_exist():
    assert any(p.name == "demo.yaml" for p in SHIPPED)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


MINIMAL = "data:\n  tasks:\n    - name: xnli\n"


def test_defaults_and_overrides(tmp_path):
    config = load_config(
        write(tmp_path, MINIMAL),
        ["training.max_steps=7", "training.optimizer.lr=1e-3", "data.tasks.0.languages=[en, de]", "run.name=x"],
    )
    assert config.training.max_steps == 7
    assert config.training.optimizer.lr == pytest.approx(1e-3)
    assert config.data.tasks[0].languages == ["en", "de"]
    assert config.run.output_dir == "runs/x"
    assert config.weighting.method == "mean"


@pytest.mark.parametrize(
    "override, expected",
    [
        ("training.lrr=1", "unknown key 'training.lrr'; valid keys under 'training': deepspeed_config"),
        ("training.optimizer.name=adam", "training.optimizer.name: invalid value; valid choices: adamw, sgd"),
        ("training.max_steps=abc", "training.max_steps: Input should be a valid integer"),
        ("training.max_steps=0", "training.max_steps: Input should be greater than or equal to 1 (got 0)"),
        ("model.dropout=1.5", "model.dropout: Input should be less than 1"),
        (
            "weighting.method=magic",
            "unknown weighting 'magic'; valid choices: cagrad, imtl_g, lfmlf, mean, mgda_normalized, pcgrad, upgrad",
        ),
        ("data.mixing.strategy=random", "valid choices: proportional, temperature, uniform"),
        ("model.tiny.hidden_size=65", "hidden_size (65) must be a multiple of num_attention_heads (4)"),
        ("training.optimizer.betas=[0.9, 1.5]", "betas must lie in [0, 1)"),
        ("weighting.options={solver: gurobi}", "'solver' is not an option of weighting 'mean' (an option of lfmlf, "),
        ("weighting.shared=heads", "weighting.shared: invalid value; valid choices: auto, encoder, all"),
    ],
)
def test_bad_values_name_key_file_and_choices(tmp_path, override, expected):
    path = write(tmp_path, MINIMAL)
    with pytest.raises(ConfigError) as info:
        load_config(path, [override])
    message = str(info.value)
    assert expected in message
    assert str(path) in message and "[command line]" in message
    assert "\n" not in message


def test_unknown_key_in_file(tmp_path):
    path = write(tmp_path, MINIMAL + "trainin:\n  max_steps: 3\n")
    with pytest.raises(
        ConfigError, match=r"unknown key 'trainin'; valid keys: checkpointing, corpus, data, evaluation"
    ):
        load_config(path)


def test_missing_required_and_malformed(tmp_path):
    with pytest.raises(ConfigError, match="required key 'data' is missing"):
        load_config(write(tmp_path, "run:\n  name: a\n"))
    with pytest.raises(ConfigError, match=r"malformed YAML \(line 3, column 1\)"):
        load_config(write(tmp_path, "data:\n  tasks: [\n"))
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "absent.yaml")
    with pytest.raises(ConfigError, match="is empty"):
        load_config(write(tmp_path, ""))
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(write(tmp_path, "- a\n- b\n"))


def test_yaml_is_loaded_safely(tmp_path):
    with pytest.raises(ConfigError, match="malformed YAML"):
        load_config(write(tmp_path, "data: !!python/object/apply:os.system ['echo pwned']\n"))


def test_override_syntax():
    assert parse_override("a.b=3") == ("a.b", 3)
    assert parse_override("a=[1, 2]") == ("a", [1, 2])
    assert parse_override("a=") == ("a", None)
    for bad in ("novalue", "=3", "a..b=1"):
        with pytest.raises(ConfigError, match="bad override"):
            parse_override(bad)
    tree = {"x": [{"y": 1}]}
    set_dotted(tree, "x.0.y", 2)
    assert tree == {"x": [{"y": 2}]}
    with pytest.raises(ConfigError, match="not an index"):
        set_dotted(tree, "x.3.y", 2)


def test_duplicate_languages_refused(tmp_path):
    with pytest.raises(ConfigError, match="lists a language twice"):
        load_config(write(tmp_path, MINIMAL), ["data.tasks.0.languages=[en, en]"])


def test_cli_help_lists_the_sections_and_a_section_its_keys():
    brief = run_cli("--help")
    assert brief.returncode == 0
    assert "\n  training       Steps, batch sizes, optimizer" in brief.stdout and "--help SECTION" in brief.stdout
    assert "training.optimizer.lr" not in brief.stdout  # the keys are a section at a time
    assert "score" in brief.stdout  # the other commands
    training = run_cli("--help", "training")
    assert training.returncode == 0
    assert "training.optimizer.lr  [float, default: 5e-05]" in training.stdout
    assert "Peak learning rate." in training.stdout and "data.mixing" not in training.stdout
    assert "data.mixing.strategy  [proportional|temperature|uniform" in run_cli("--help", "data.mixing").stdout
    # each weighting's typed options (weighting.options is a mapping whose keys depend on weighting.method)
    weighting = run_cli("-h", "weighting").stdout
    assert "weighting.options.floor  [float, default: 0.0]" in weighting and "(lfmlf) The collapse" in weighting
    assert "weighting.options.rescale  [0|1|2, default: 0]" in weighting
    every = run_cli("--help", "all")
    keys = [line.split()[0] for line in every.stdout.splitlines() if re.match(r"  \S+  \[", line)]
    assert keys == [key for key, *_ in iter_options()] and "forgetting.probe.gammas" in keys
    unknown = run_cli("--help", "trainig")
    assert unknown.returncode == 2 and unknown.stdout == ""
    assert unknown.stderr.strip() == (
        "error: --help 'trainig': no config key is under it; the sections: run, model, data, weighting, gradients, "
        "training, evaluation, checkpointing, logging, corpus, pretrain, forgetting, stability, or all"
    )


def test_cli_print_config_and_error_exit(tmp_path):
    result = run_cli("--config", "configs/demo.yaml", "--print-config", "training.max_steps=9")
    assert result.returncode == 0 and "max_steps: 9" in result.stdout
    result = run_cli("--config", "configs/demo.yaml", "training.max_steps=-4")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr
    assert result.stderr.startswith("error: configs/demo.yaml [command line]: training.max_steps")


def test_deepspeed_config_comes_from_the_run_config(tmp_path, monkeypatch):
    from mtft.training.engine import deepspeed_config

    monkeypatch.chdir(REPO)
    config = load_config(
        REPO / "configs/demo.yaml",
        [
            "training.gradient_clipping=0.5",
            "weighting.method=mean",
            "weighting.options={}",
            "training.gradient_accumulation_steps=3",
            "training.deepspeed_config=configs/deepspeed/zero2.json",
        ],
    )
    ds = deepspeed_config(config, world_size=2)
    assert ds["gradient_clipping"] == 0.5 and ds["zero_optimization"]["stage"] == 2
    assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"], ds["train_batch_size"]) == (
        32,
        3,
        192,
    )
    assert ds["bf16"] == {"enabled": False}  # no GPU here: auto precision is fp32
    # a Gram weighting accumulates the micro-batches itself and hands DeepSpeed one combined gradient
    config.weighting.method = "lfmlf"
    assert (
        deepspeed_config(config, 2)["train_micro_batch_size_per_gpu"],
        deepspeed_config(config, 2)["gradient_accumulation_steps"],
    ) == (96, 1)
    clash = tmp_path / "ds.json"
    clash.write_text('{"gradient_clipping": 1.0, "zero_optimization": {"stage": 1}}')
    config.training.deepspeed_config = str(clash)
    with pytest.raises(ConfigError, match="remove gradient_clipping from the DeepSpeed JSON"):
        deepspeed_config(config, 1)


def test_non_finite_numbers_and_bad_names_are_refused(tmp_path):
    path = write(tmp_path, MINIMAL)
    for override, message in [
        ("training.optimizer.lr=.inf", "finite number"),
        ("training.optimizer.lr=.nan", "finite number"),
        ("data.tasks.0.languages=[../../x]", "language '../../x' is not a valid name"),
        ("data.tasks.0.name=/tmp/x", "task name '/tmp/x' is not a valid name"),
    ]:
        with pytest.raises(ConfigError, match=message):
            load_config(path, [override])


def test_overwrite_replaces_only_an_mtft_run_directory(tmp_path):
    """A folder holding a config.yaml proves nothing: only the COMPLETE marker of kind "run" allows overwrite."""
    from mtft.core.atomic import AtomicFolder
    from mtft.training.setup import check_output_dir

    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "config.yaml").write_text("mine: true\n")
    config = load_config(write(tmp_path, MINIMAL), [f"run.output_dir={foreign}", "run.overwrite=true"])
    with pytest.raises(ConfigError, match="is not an mtft run directory"):
        check_output_dir(config)
    assert sorted(p.name for p in foreign.iterdir()) == ["config.yaml"]
    with AtomicFolder(tmp_path / "run").writing(kind="run") as folder:
        (folder / "config.yaml").write_text("run: {}\n")
    config = load_config(write(tmp_path, MINIMAL), [f"run.output_dir={tmp_path / 'run'}", "run.overwrite=true"])
    assert check_output_dir(config) is None


def test_long_values_are_not_echoed_whole(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, MINIMAL), ["training.max_steps=" + "9x" * 50000])
    assert len(str(info.value)) < 600


def test_longest_row_covers_every_task_max_length():
    """A tiny encoder is built with positions for the longest task rows (a QA task's 96 > data.max_length 64)."""
    from mtft.config.schema import DataSection

    data = DataSection(max_length=64, tasks=[{"name": "xnli"}, {"name": "tydiqa", "max_length": 96}])
    assert data.longest_row == 96
    assert DataSection(max_length=64, tasks=[{"name": "xnli", "max_length": 32}]).longest_row == 64


def test_the_built_in_zero_stages_are_the_shipped_files():
    """training.deepspeed_config: zero0 ... zero3 need no file (an installed mtft, a user's own folder); the
    checkout's configs/deepspeed/<name>.json are the same JSON, to copy and edit."""
    from mtft.config.deepspeed import BUILT_IN, read_deepspeed_json

    for name, data in BUILT_IN.items():
        assert json.loads((REPO / "configs" / "deepspeed" / f"{name}.json").read_text()) == data
        assert read_deepspeed_json(name) == data
    assert sorted(p.stem for p in (REPO / "configs" / "deepspeed").glob("*.json")) == sorted(BUILT_IN)
    assert RunConfig.model_fields["training"].default_factory().deepspeed_config == "zero0"
