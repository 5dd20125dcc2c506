"""Leave-one-out stability: the study's paired runs, the trained part of a run, and the distances of Def. 2.1/2.3."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModel, XLMRobertaConfig

from mtft.adapters import build_method
from mtft.config.load import config_to_yaml
from mtft.config.schema import AdapterSection
from mtft.core.atomic import AtomicFolder
from mtft.core.errors import ConfigError
from mtft.models.multitask import MultiTaskModel
from mtft.models.tokenizer import tiny_tokenizer
from mtft.study import loo
from mtft.study.plan import plan_runs
from mtft.study.spec import load_study
from mtft.tasks.kinds import build_head
from tests.helpers.data import make_config
from tests.helpers.study import write_study

HEADS = {"xnli": {"kind": "sequence_classification", "label_names": ["entailment", "neutral", "contradiction"]}}


def save(tmp_path: Path, name: str, tensors: dict[str, torch.Tensor]) -> Path:
    path = tmp_path / f"{name}.safetensors"
    save_file(tensors, str(path))
    return path


def test_distance_of_a_run_with_itself_is_zero_and_hand_computed_otherwise(tmp_path):
    a = {"w": torch.tensor([[3.0, 0.0], [0.0, 4.0]]), "b": torch.tensor([0.0]), "frozen": torch.tensor([9.0])}
    b = {"w": torch.tensor([[3.0, 1.0], [0.0, 4.0]]), "b": torch.tensor([2.0]), "frozen": torch.tensor([-9.0])}
    shapes = {"w": (2, 2), "b": (1,)}  # "frozen" is not a trained parameter: it does not count
    file_a, file_b = save(tmp_path, "a", a), save(tmp_path, "b", b)
    assert loo.weight_distances(file_a, file_a, shapes) == (0.0, 0.0)
    distance, normalized = loo.weight_distances(file_a, file_b, shapes)
    assert distance == pytest.approx(math.sqrt(1.0 + 4.0))  # (0, 1, 0, 0, 2): ||A(S^i) − A(S)||
    va, vb = [3.0, 0.0, 0.0, 4.0, 0.0], [3.0, 1.0, 0.0, 4.0, 2.0]  # |va| = 5, |vb| = sqrt(30)
    expected = math.sqrt(sum((x / 5.0 - y / math.sqrt(30.0)) ** 2 for x, y in zip(va, vb)))
    assert normalized == pytest.approx(expected, rel=1e-12)


def test_a_scaled_head_has_normalized_distance_zero(tmp_path):
    a = {"w": torch.tensor([1.0, -2.0, 0.5])}
    file_a, file_b = save(tmp_path, "a", a), save(tmp_path, "b", {"w": 7.0 * a["w"]})
    distance, normalized = loo.weight_distances(file_a, file_b, {"w": (3,)})
    assert distance == pytest.approx(6.0 * math.sqrt(1 + 4 + 0.25))
    assert normalized == pytest.approx(0.0, abs=1e-12)  # Def. 2.3 sees directions only


def test_mhloss_stacked_heads_count_as_their_average(tmp_path):
    name = "heads.xnli.out_proj.weight"
    stacked = torch.arange(12.0).reshape(3, 2, 2)  # H = 3 heads of a 2x2 head
    file_a = save(tmp_path, "a", {name: stacked})
    file_b = save(tmp_path, "b", {name: stacked.mean(0)})
    assert loo.weight_distances(file_a, file_b, {name: (2, 2)}) == (0.0, 0.0)


def test_a_trained_parameter_missing_from_a_checkpoint_is_one_error(tmp_path):
    file_a, file_b = save(tmp_path, "a", {"w": torch.ones(2)}), save(tmp_path, "b", {"v": torch.ones(2)})
    with pytest.raises(Exception, match="has no w, a trained parameter of the run"):
        loo.weight_distances(file_a, file_b, {"w": (2,)})


def fake_run(tmp_path: Path, method: str) -> tuple[Path, Path]:
    """A run directory as a finished run leaves it (config, encoder config, one complete checkpoint), with the
    weights of the model that method builds."""
    run_dir = tmp_path / method
    config = make_config()
    lora = {"r": 2, "target_modules": ["query", "value"]} if "lora" in method else {}
    adapter = AdapterSection(method=method, **lora)  # the method's own options, typed
    config = config.model_copy(update={"model": config.model.model_copy(update={"adapter": adapter})})
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(config_to_yaml(config), encoding="utf-8")
    encoder_config = XLMRobertaConfig(
        vocab_size=50, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16
    )
    encoder_config.save_pretrained(str(run_dir / "encoder"))
    tiny_tokenizer(["a small text"], 50, tmp_path / "tokenizers").save_pretrained(str(run_dir / "encoder"))
    encoder = AutoModel.from_config(AutoConfig.from_pretrained(str(run_dir / "encoder")))
    encoder.pooler = None
    build_method(config.model.adapter).apply(encoder, list(HEADS), ["xnli/en"], 0)
    heads = {t: build_head(m["kind"], 8, m["label_names"], 0.0) for t, m in HEADS.items()}
    model = MultiTaskModel(encoder, heads, num_objectives=1)
    checkpoint = run_dir / "checkpoints" / "step-00000010"
    checkpoint.parent.mkdir()
    with AtomicFolder(checkpoint).writing(kind="checkpoint") as partial:
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(partial / "model.safetensors"))
        (partial / "heads.json").write_text(json.dumps(HEADS))
        (partial / "trainer_state.json").write_text(json.dumps({"objectives": ["xnli/en"]}))
    return run_dir, checkpoint


@pytest.mark.parametrize(
    ("method", "part"),
    [
        ("full", "encoder weights + task heads"),
        ("head", "task heads"),
        ("lora", "adapters (lora_A, lora_B) + task heads"),
        ("multi_lora", "adapters (lora_A, lora_B) + task heads"),
    ],
)
def test_the_trained_part_is_what_the_method_trains(tmp_path, method, part):
    from mtft.training.restore import load_run  # the one way back to a run's model: the study must agree with it

    run_dir, checkpoint = fake_run(tmp_path, method)
    assert loo.final_checkpoint(run_dir) == checkpoint
    trained = loo.trained_part(run_dir, checkpoint)
    assert trained.description == part
    model = load_run(run_dir).model
    expected = {n: tuple(p.shape) for n, p in model.named_parameters() if p.requires_grad}
    assert trained.shapes == expected
    assert trained.size == sum(p.numel() for p in model.parameters() if p.requires_grad)
    weights = checkpoint / "model.safetensors"
    assert loo.weight_distances(weights, weights, trained.shapes) == (0.0, 0.0)


def test_plan_adds_the_paired_runs_on_s_i(tmp_path):
    path = write_study(tmp_path, leave_one_out={"count": 1, "draws": 2, "seed": 5})
    spec, base = load_study(path)
    runs = plan_runs(spec, base, path)
    assert len(runs) == 2 * 2 * 3  # 2 cells x 2 seeds x (S + 2 draws)
    first = runs[:3]
    assert [r.slot for r in first] == ["seed-0", "seed-0-loo-0", "seed-0-loo-1"]
    assert {r.seed for r in first} == {0} and [r.draw for r in first] == [None, 0, 1]
    configs = [yaml.safe_load(r.config_yaml) for r in first]
    assert configs[0]["data"]["leave_out"] is None
    assert [c["data"]["leave_out"] for c in configs[1:]] == [
        {"count": 1, "fraction": None, "seed": 5},
        {"count": 1, "fraction": None, "seed": 6},
    ]
    assert all(c["run"]["seed"] == 0 for c in configs)  # the same fine-tuning seed on S and S^i
    s, s_i = yaml.safe_load(first[0].config_yaml), configs[1]
    for config in (s, s_i):  # nothing else differs
        config["data"].pop("leave_out")
        config["run"].pop("output_dir")
        config["run"].pop("name")
    assert s == s_i
    assert first[1].run_dir == tmp_path / "study/runs/lr-0.001/seed-0-loo-0"
    assert first[1].config_path == tmp_path / "study/configs/lr-0.001/seed-0-loo-0.yaml"
    assert first[1].key == "lr-0.001/seed-0-loo-0"


def test_a_study_without_leave_one_out_plans_no_pairs(tmp_path):
    path = write_study(tmp_path)
    spec, base = load_study(path)
    assert all(r.draw is None for r in plan_runs(spec, base, path))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"leave_one_out": {"draws": 2}}, "leave_one_out: give exactly one of count: N and fraction: F"),
        ({"leave_one_out": {"count": 1, "draws": 0}}, "leave_one_out.draws: .*greater than or equal to 1"),
        ({"leave_one_out": {"count": 1, "seeds": 3}}, "unknown key 'leave_one_out.seeds'; valid keys: count, fraction"),
        (
            {"leave_one_out": {"fraction": 0.1}, "overrides": {"data.leave_out": {"count": 1}}},
            "data.leave_out is set by the study's leave_one_out",
        ),
    ],
)
def test_bad_leave_one_out_is_one_line(tmp_path, fields, message):
    path = write_study(tmp_path, **fields)
    with pytest.raises(ConfigError, match=message) as error:
        spec, base = load_study(path)
        plan_runs(spec, base, path)
    assert "\n" not in str(error.value)


def test_measure_pairs_each_finished_run_on_s_i_with_its_run_on_s(tmp_path):
    from safetensors.torch import load_file

    from mtft.study.plan import Cell, PlannedRun

    (tmp_path / "s").mkdir(), (tmp_path / "si").mkdir()
    s_dir, checkpoint = fake_run(tmp_path / "s", "head")
    si_dir, si_checkpoint = fake_run(tmp_path / "si", "head")
    weights = load_file(str(checkpoint / "model.safetensors"))  # S^i starts from S's final weights
    name = next(n for n in loo.trained_part(s_dir, checkpoint).shapes if n.startswith("heads."))
    weights[name] = weights[name] + 0.5  # the run on S^i ended elsewhere on one trained tensor only
    weights["encoder.embeddings.word_embeddings.weight"] += 1.0  # frozen under head tuning: does not count
    save_file(weights, str(si_checkpoint / "model.safetensors"))
    for run_dir in (s_dir, si_dir):
        (run_dir / "COMPLETE").write_text("{}")
        (run_dir / "metrics.json").write_text('{"step": 10}')
    cell = Cell("c", {"variant": "c"}, {})
    runs = [
        PlannedRun(cell, 0, s_dir, tmp_path / "s.yaml", ""),
        PlannedRun(cell, 0, si_dir, tmp_path / "si.yaml", "", draw=0),
        PlannedRun(cell, 0, tmp_path / "not-run", tmp_path / "n.yaml", "", draw=1),
    ]
    (result,) = loo.measure(runs, ["c"])
    (pair,) = result.pairs
    assert (pair.seed, pair.draw) == (0, 0)
    assert pair.distance == pytest.approx(0.5 * math.sqrt(math.prod(weights[name].shape)), rel=1e-6)
    assert result.distance.n == 1 and result.distance.mean == pair.distance and result.distance.std is None
    assert result.trained_part.startswith("task heads (")
    assert len(result.missing) == 1 and result.missing[0].startswith("c/seed-0-loo-1: not finished")
    table = "\n".join(loo.markdown([result]))
    assert "| c | task heads (" in table and "c/seed-0-loo-1: not finished" in table


def test_summaries_are_over_every_finite_pair():
    summary = loo.summarize([1.0, 2.0, 3.0, math.nan])
    assert (summary.n, summary.mean, summary.min, summary.max) == (3, 2.0, 1.0, 3.0)
    assert summary.std == pytest.approx(1.0)
    assert loo.summarize([]).mean is None


@pytest.mark.parametrize(
    "failed, expect",
    [
        ({"c/seed-0-loo-0": "error: S^i went wrong"}, "c/seed-0-loo-0: failed: error: S^i went wrong"),
        ({"c/seed-0": "error: S went wrong"}, "c/seed-0-loo-0: its run on S, c/seed-0, failed: error: S went wrong"),
        ({}, "c/seed-0-loo-0: not finished (or its run on S, c/seed-0)"),
    ],
)
def test_a_pair_not_measured_because_a_run_failed_shows_its_error_line(tmp_path, failed, expect):
    from mtft.study.plan import Cell, PlannedRun

    cell = Cell("c", {"variant": "c"}, {})
    runs = [
        PlannedRun(cell, 0, tmp_path / "s", tmp_path / "s.yaml", ""),
        PlannedRun(cell, 0, tmp_path / "si", tmp_path / "si.yaml", "", draw=0),
    ]
    (result,) = loo.measure(runs, ["c"], failed)
    assert result.missing == [expect] and not result.pairs
    assert f"- {expect}" in loo.markdown([result])
