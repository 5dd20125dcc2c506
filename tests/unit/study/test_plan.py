"""The study file and its plan: cells, names, seeds, validation of every cell before anything runs."""

from __future__ import annotations

import pytest
import yaml

from mtft.core.errors import ConfigError
from mtft.fixtures.minilm import minilm_folder
from mtft.study.plan import expand_cells
from mtft.study.state import check_run_configs, open_study_dir, write_run_configs
from tests.helpers.launch import REPO
from tests.helpers.study import plan, write_study


def test_grid_times_variants_times_seeds(tmp_path):
    path = write_study(
        tmp_path,
        variants=[
            {"name": "mean", "overrides": {"weighting.method": "mean", "weighting.options": {}}},
            {"name": "lfmlf"},
        ],
        baseline={"variant": "mean"},
    )
    spec, runs = plan(path)
    assert spec.axes == ["variant", "training.optimizer.lr"]
    assert [c.name for c in expand_cells(spec)] == ["mean_lr-0.001", "mean_lr-0.01", "lfmlf_lr-0.001", "lfmlf_lr-0.01"]
    assert len(runs) == 8
    run = runs[0]
    config = yaml.safe_load(run.config_yaml)
    assert config["weighting"]["method"] == "mean" and config["training"]["optimizer"]["lr"] == 0.001
    assert config["run"]["seed"] == 0 and config["run"]["output_dir"] == str(
        tmp_path / "study/runs/mean_lr-0.001/seed-0"
    )
    assert run.config_path == tmp_path / "study/configs/mean_lr-0.001/seed-0.yaml"
    assert yaml.safe_load(runs[-1].config_yaml)["weighting"]["method"] == "lfmlf"  # the demo's own


def test_factors_are_named_axes_crossed_with_variants_and_grid(tmp_path):
    setups = {
        "full-sgd": {"model.adapter.method": "full", "training.optimizer": {"name": "sgd", "lr": 0.1}},
        "lora-adamw": {"model.adapter.method": "multi_lora", "training.optimizer.lr": 0.01},
    }
    path = write_study(
        tmp_path,
        variants=[
            {"name": "mean", "overrides": {"weighting.method": "mean", "weighting.options": {}}},
            {"name": "lfmlf"},
        ],
        factors={"setup": setups},
        grid={"training.max_steps": [5]},
        baseline={"variant": "mean"},
    )
    spec, runs = plan(path, "seeds=[0]")
    assert spec.axes == ["variant", "setup", "training.max_steps"]
    cells = expand_cells(spec)
    assert [c.name for c in cells] == [
        "mean_full-sgd_max_steps-5",
        "mean_lora-adamw_max_steps-5",
        "lfmlf_full-sgd_max_steps-5",
        "lfmlf_lora-adamw_max_steps-5",
    ]
    assert cells[1].axes == {"variant": "mean", "setup": "lora-adamw", "training.max_steps": 5}
    config = yaml.safe_load(runs[0].config_yaml)
    assert config["training"]["optimizer"]["name"] == "sgd" and config["model"]["adapter"]["method"] == "full"
    assert yaml.safe_load(runs[3].config_yaml)["training"]["optimizer"]["lr"] == 0.01


def test_exclude_leaves_out_the_cells_it_names(tmp_path):
    path = write_study(
        tmp_path,
        variants=[
            {"name": "mean", "overrides": {"weighting.method": "mean", "weighting.options": {}}},
            {"name": "lfmlf"},
        ],
        factors={"opt": {"sgd": {"training.optimizer.name": "sgd"}, "adamw": {}}},
        exclude=[{"variant": "lfmlf", "opt": "sgd"}, {"variant": "mean", "training.optimizer.lr": 0.01}],
    )
    spec, runs = plan(path, "seeds=[0]")
    names = [c.name for c in expand_cells(spec)]
    assert names == ["mean_sgd_lr-0.001", "mean_adamw_lr-0.001", "lfmlf_adamw_lr-0.001", "lfmlf_adamw_lr-0.01"]
    assert [r.cell.name for r in runs] == names


def test_num_seeds_and_command_line_overrides(tmp_path):
    path = write_study(tmp_path, seeds=None, num_seeds=3)
    spec, runs = plan(path, "num_seeds=2", "overrides.training.max_steps=7", "executor.workers=1")
    assert spec.seed_list == [0, 1] and spec.executor.workers == 1
    assert {yaml.safe_load(r.config_yaml)["training"]["max_steps"] for r in runs} == {7}


def test_fewer_seeds_run_the_first_seeds_of_the_cells_they_name(tmp_path):
    path = write_study(
        tmp_path,
        seeds=[3, 5, 8, 9],
        variants=[
            {"name": "mean", "overrides": {"weighting.method": "mean", "weighting.options": {}}},
            {"name": "lfmlf"},
        ],
        fewer_seeds=[
            {"cells": {"variant": "lfmlf"}, "num_seeds": 2},
            {"cells": {"training.optimizer.lr": 0.01}, "num_seeds": 3},
        ],
    )
    spec, runs = plan(path)
    seeds = {}
    for run in runs:
        seeds.setdefault(run.cell.name, []).append(yaml.safe_load(run.config_yaml)["run"]["seed"])
    # the fewest of the entries a cell matches
    assert seeds == {
        "mean_lr-0.001": [3, 5, 8, 9],
        "mean_lr-0.01": [3, 5, 8],
        "lfmlf_lr-0.001": [3, 5],
        "lfmlf_lr-0.01": [3, 5],
    }
    # seed by seed: a study stopped part-way has whole seeds of every cell that runs them
    order = [(run.cell.name, yaml.safe_load(run.config_yaml)["run"]["seed"]) for run in runs]
    assert order == [
        *[(cell, 3) for cell in seeds],
        *[(cell, 5) for cell in seeds],
        ("mean_lr-0.001", 8),
        ("mean_lr-0.01", 8),
        ("mean_lr-0.001", 9),
    ]


def test_clashing_axis_names_and_values_stay_apart(tmp_path):
    path = write_study(tmp_path, grid={"training.optimizer.lr": [0.001], "pretrain.optimizer.lr": [1e-3, "1e-3"]})
    spec, _ = plan(path, "seeds=[0]")
    names = [c.name for c in expand_cells(spec)]
    assert len(set(names)) == 2 and all(n.startswith("training.optimizer.lr-0.001_pretrain") for n in names)


def test_seed_keys_set_every_listed_seed_to_the_runs_seed(tmp_path):
    """By default a seed is the fine-tuning seed only (the runs of a cell share one pre-trained backbone); with
    ``seed_keys: [run.seed, pretrain.seed]`` each seed pre-trains its own backbone too."""
    _, shared = plan(write_study(tmp_path))
    configs = [yaml.safe_load(run.config_yaml) for run in shared]
    assert [c["run"]["seed"] for c in configs] == [0, 0, 1, 1]  # seed by seed
    assert {c["pretrain"]["seed"] for c in configs} == {0}  # the run config's own, whatever the seed
    _, own = plan(write_study(tmp_path, seeds=[3, 5], seed_keys=["run.seed", "pretrain.seed"]))
    configs = [yaml.safe_load(run.config_yaml) for run in own]
    assert [(c["run"]["seed"], c["pretrain"]["seed"]) for c in configs] == [(3, 3), (3, 3), (5, 5), (5, 5)]
    assert [run.run_dir.name for run in own] == ["seed-3", "seed-3", "seed-5", "seed-5"]


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"grid": {"training.optimizer.lrr": [1]}}, "unknown key 'training.optimizer.lrr'"),
        ({"grid": {"training.optimizer.lr": [0.001, -1.0]}}, "[cell lr--1.0]"),
        ({"grid": {"run.seed": [1, 2]}}, "set by the study itself"),
        ({"grid": {"training.optimizer.lr": []}}, "lists no values"),
        ({"seeds": None}, "exactly one of seeds"),
        ({"num_seeds": 2}, "exactly one of seeds"),
        ({"seeds": [1, 1]}, "distinct"),
        ({"baseline": {"weighting.method": "mean"}}, "not an axis of the study"),
        ({"factors": {"a.b": {"x": {}}}}, "must be a plain name"),
        ({"factors": {"opt": {}}}, "has no levels"),
        ({"factors": {"opt": {"../x": {}}}}, "level name"),
        ({"factors": {"opt": {"sgd": {}}}, "baseline": {"opt": "adam"}}, "is not one of"),
        ({"baseline": {"training.optimizer.lr": 0.5}}, "is not one of"),
        ({"exclude": [{"variant": "mean"}]}, "exclude[0]: 'variant' is not an axis"),
        ({"exclude": [{"training.optimizer.lr": 0.5}]}, "exclude[0]: training.optimizer.lr=0.5 is not one of"),
        ({"exclude": [{}]}, "exclude[0] is empty"),
        ({"fewer_seeds": [{"cells": {}, "num_seeds": 1}]}, "fewer_seeds[0].cells is empty"),
        ({"fewer_seeds": [{"cells": {"training.optimizer.lr": 0.001}, "num_seeds": 3}]}, "exceeds the study's 2 seeds"),
        (
            {"fewer_seeds": [{"cells": {"colour": "red"}, "num_seeds": 1}]},
            "fewer_seeds[0].cells: 'colour' is not an axis",
        ),
        ({"colour": "red"}, "unknown key 'colour'"),
        ({"executor": {"workerz": 2}}, "unknown key 'executor.workerz'; valid keys: name, workers"),
        ({"variants": [{"name": "../x"}]}, "variant name"),
        ({"overrides": {"run.resume": True}}, "decided by the study"),
        ({"base": "missing.yaml"}, "not found"),
        ({"seed_keys": ["pretrain.seed"]}, "must include run.seed"),
        ({"seed_keys": ["run.seed", "training.optimizer.lr"]}, "'training.optimizer.lr' is not a seed"),
        ({"seed_keys": ["run.seed", "pretrain.seed", "pretrain.seed"]}, "listed twice"),
        ({"seed_keys": ["run.seed", "pretrain.seed"], "grid": {"pretrain.seed": [0, 1]}}, "cannot also be a grid"),
        (
            {"exclude": [{"training.optimizer.lr": 0.001}, {"training.optimizer.lr": 0.01}]},
            "exclude leaves out every cell of the study",
        ),
        (  # one cell's DeepSpeed JSON is missing (a path relative to another folder): before any run starts
            {"grid": {"training.deepspeed_config": ["configs/deepspeed/zero2.json", "deepspeed/zero2.json"]}},
            "[cell deepspeed_config-deepspeed-zero2.json]: training.deepspeed_config: file not found",
        ),
        (  # what one cell's ZeRO stage rules out (run.py's preflight refuses it too): before any run starts
            {
                "overrides": {
                    "forgetting.enabled": True,
                    "training.deepspeed_config": str(REPO / "configs" / "deepspeed" / "zero3.json"),
                },
                "grid": {"forgetting.regularization": [0.0, 0.01]},
            },
            "[cell regularization-0.01]: forgetting.regularization adds λ(θ − θ_p)",
        ),
        # a line break would end the #SBATCH line and start a shell line of the job script
        ({"executor": {"name": "slurm", "slurm": {"partition": "gpu\ntouch /tmp/x"}}}, "partition: must be one line"),
        ({"executor": {"slurm": {"additional": {"qos": "high\r\ntouch /tmp/x"}}}}, "additional: 'qos'"),
        # the study owns each run's folder, name and seeds: refused nested or dotted, in every kind of overrides
        ({"overrides": {"run": {"output_dir": "/tmp/ESC", "name": "x"}}}, "'run.output_dir' is set by the study"),
        ({"overrides": {"run": {"seed": 4}}}, "'run.seed' is set by the study"),
        ({"variants": [{"name": "a", "overrides": {"run.name": "x"}}]}, "'run.name' is set by the study"),
        (
            {"seed_keys": ["run.seed", "pretrain.seed"], "factors": {"f": {"a": {"pretrain": {"seed": 3}}}}},
            "[cell a_lr-0.001]: 'pretrain.seed' is set by the study",
        ),
    ],
)
def test_bad_study_one_line_naming_the_problem(tmp_path, fields, message):
    path = write_study(tmp_path, **fields)
    with pytest.raises(ConfigError) as caught:
        plan(path)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert not (tmp_path / "study").exists()  # validated before anything is written


def test_study_directory_of_another_study_or_not_a_study_is_refused(tmp_path):
    root = tmp_path / "study"
    open_study_dir(root, "one", "name: one\n")
    open_study_dir(root, "one", "name: one\n")  # the same study again: accepted
    with pytest.raises(ConfigError, match="holds study 'one', not 'two'"):
        open_study_dir(root, "two", "name: two\n")
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="is not a study directory"):
        open_study_dir(other, "one", "")
    assert (other / "notes.txt").read_text() == "keep me"


def test_a_run_whose_config_changed_is_refused(tmp_path):
    path = write_study(tmp_path)
    _, runs = plan(path)
    write_run_configs(runs)
    check_run_configs(runs)  # unchanged: fine
    _, changed = plan(path, "overrides.training.max_steps=5")
    with pytest.raises(ConfigError, match=r"lr-0.001/seed-0 was run with a different config \(training.max_steps"):
        check_run_configs(changed)


@pytest.mark.parametrize("path", sorted((REPO / "configs" / "studies").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_study_plans(path):
    """Every run of every shipped study resolves to a valid run config (the MiniLM study on the folder its
    comment extracts: here the mtft cache's copy, as a fresh checkout has no backbones/ folder)."""
    overrides = []
    if "backbones/all-MiniLM-L6-v2" in path.read_text():
        overrides = [f"overrides.model.backbone={minilm_folder()}"]
    spec, runs = plan(path, *overrides)
    per_seed = 1 + (spec.leave_one_out.draws if spec.leave_one_out else 0)  # the run on S and its S^i pairs
    assert len(runs) == sum(len(spec.seeds_of(c.axes)) for c in expand_cells(spec)) * per_seed > 0


def test_a_cell_with_an_unknown_language_is_refused_before_anything_runs(tmp_path):
    """Beyond the schema: the checks run.py makes before it starts (tasks, languages, metric, data, backbone)."""
    path = write_study(tmp_path, grid={"data.tasks.0.languages": [["en", "de"], ["en", "de", "xx"]]}, seeds=[0])
    with pytest.raises(ConfigError, match=r"\[cell languages-en\.de\.xx\]: task 'xnli' has no language\(s\) xx"):
        plan(path)


def test_an_option_added_later_with_its_default_is_no_change():
    from mtft.study.plan import config_difference

    old = "run: {seed: 1}\npretrain: {tokens: 5}\n"
    assert config_difference(old, "run: {seed: 1}\npretrain: {tokens: 5, vocabulary: corpus}\n") is None
    assert "pretrain.vocabulary" in config_difference(
        old, "run: {seed: 1}\npretrain: {tokens: 5, vocabulary: corpus+tasks}\n"
    )
    assert "run.seed: 1 then, 2 now" in config_difference(old, "run: {seed: 2}\npretrain: {tokens: 5}\n")


@pytest.mark.parametrize("axis", ["grid", "variants"])
def test_a_cell_that_switches_the_weighting_drops_the_base_configs_options(tmp_path, axis):
    """The demo's base config has lfmlf with {floor: 0.3}: a cell of weighting.method=mean trains mean without the
    floor, as weighting.method=mean on the command line does (one rule, mtft.config.load.options_follow_methods),
    while the lfmlf cell keeps it."""
    if axis == "grid":
        path = write_study(tmp_path, grid={"weighting.method": ["mean", "lfmlf"]})
    else:
        variants = [{"name": m, "overrides": {"weighting.method": m}} for m in ("mean", "lfmlf")]
        path = write_study(tmp_path, grid={}, variants=variants)
    _, runs = plan(path, "seeds=[0]")
    weighting = {
        yaml.safe_load(r.config_yaml)["weighting"]["method"]: yaml.safe_load(r.config_yaml)["weighting"]["options"]
        for r in runs
    }
    assert weighting == {"mean": {}, "lfmlf": {"floor": 0.3}}
