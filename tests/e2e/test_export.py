"""``run.py export``: every task's adapter loads with ``peft.PeftModel.from_pretrained`` and reproduces mtft."""

from __future__ import annotations

import json

import peft
import pytest
import torch
import yaml
from safetensors.torch import load_file
from transformers import AutoModel, AutoTokenizer

from mtft.api.run import load_run as load_trained_run
from mtft.api.run import read_input
from mtft.commands.export import export_run
from mtft.tasks.kinds import build_head
from mtft.training.restore import load_run
from tests.helpers.launch import run_cli
from tests.helpers.runs import BASE_CONFIG, base_overrides, read_jsonl, second_task

TEXTS = [("Der Hund schläft nicht.", "Ein Tier ruht."), ("the cat is awake", "a cat sleeps"), ("x", "y z")]


@pytest.fixture(scope="module")
def trained_runs(tmp_path_factory):
    """A short two-task run per method (B's trained away from zero); the head-only run is predicted only (issue 31:
    predict reproduces each adapter method's predictions; full fine-tuning's is tests/e2e/test_predict.py's run)."""
    root = tmp_path_factory.mktemp("export")
    second_task(root / "tasks")
    runs = {}
    for method in ("multi_lora", "lora", "head"):
        out = root / method
        result = run_cli(
            "--config",
            BASE_CONFIG,
            *base_overrides(
                out,
                12,
                **{
                    "weighting.method": "mean",
                    "model.adapter.method": method,
                    "training.optimizer.lr": 1e-2,
                    "data.tasks": "[{name: xnli, languages: [en, de], protocol: in_language, max_train_examples: 64, "
                    "max_eval_examples: 16}, {name: nli_copy, max_train_examples: 64, max_eval_examples: 16}]",
                    "data.task_dirs": f"[{root / 'tasks'}]",
                    "evaluation.every_steps": None,
                    "checkpointing.every_steps": None,
                },
            ),
        )
        assert result.returncode == 0, result.stderr[-3000:]
        runs[method] = out
    return root, runs


@pytest.mark.parametrize("method", ["multi_lora", "lora"])
def test_exported_adapter_gives_mtfts_logits_through_peft(trained_runs, method):
    root, runs = trained_runs
    out = root / f"exported-{method}"
    result = run_cli("export", "--run", str(runs[method]), "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines()[-2:] == [str(out / "xnli"), str(out / "nli_copy")]
    # nothing but the paths: no library's warning or progress bar about its own internals
    assert not [line for line in result.stderr.splitlines() if "Warning" in line or "WARNING" in line or "%|" in line]
    run = load_run(runs[method])
    tokenizer = AutoTokenizer.from_pretrained(str(out / "base"))
    enc = tokenizer([p for p, _ in TEXTS], [h for _, h in TEXTS], padding=True, return_tensors="pt")
    for task in ("xnli", "nli_copy"):
        config = json.loads((out / task / "adapter_config.json").read_text())
        rank = yaml.safe_load((runs[method] / "config.yaml").read_text())["model"]["adapter"]["r"]
        assert config["peft_type"] == "LORA" and config["r"] == rank and config["base_model_name_or_path"] == "../base"
        base = AutoModel.from_pretrained(str(out / "base"))
        model = peft.PeftModel.from_pretrained(base, str(out / task)).eval()
        meta = json.loads((out / task / "head.json").read_text())
        head = build_head(meta["kind"], meta["hidden_size"], meta["label_names"], 0.0)
        head.load_state_dict(load_file(str(out / task / "head.safetensors")))
        with torch.no_grad():
            theirs = head.eval().logits(model(**enc).last_hidden_state)
        ours = run.model.predict_logits(task, enc["input_ids"], enc["attention_mask"])
        torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=0)
        assert meta["label_names"] == ["entailment", "neutral", "contradiction"]
    with torch.no_grad():  # the adapters differ per task, and from the bare base encoder
        base = AutoModel.from_pretrained(str(out / "base"))
        plain = base(**enc).last_hidden_state
        adapted = [
            peft.PeftModel.from_pretrained(AutoModel.from_pretrained(str(out / "base")), str(out / t))(
                **enc
            ).last_hidden_state
            for t in ("xnli", "nli_copy")
        ]
    assert (adapted[0] - plain).abs().max() > 1e-4 and (adapted[0] - adapted[1]).abs().max() > 1e-4


def test_export_refuses_bad_input_and_writes_nothing(trained_runs, tmp_path):
    root, runs = trained_runs
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "keep.txt").write_text("x")
    result = run_cli("export", "--run", str(runs["multi_lora"]), "--out", str(occupied))
    assert result.returncode == 2 and "not empty" in result.stderr
    assert sorted(p.name for p in occupied.iterdir()) == ["keep.txt"]
    result = run_cli("export", "--run", str(tmp_path), "--out", str(tmp_path / "x"))
    assert result.returncode == 2 and "not an mtft run directory" in result.stderr
    assert not (tmp_path / "x").exists()
    result = run_cli("export", "--out", str(tmp_path / "x"))
    assert result.returncode == 2 and "--run" in result.stderr


@pytest.mark.parametrize("method", ["multi_lora", "lora", "head"])
def test_predict_reproduces_the_runs_predictions(trained_runs, method):
    """Each row goes through its task's adapter (Multi-LoRA: the task's B): both tasks read the same XNLI rows."""
    _, runs = trained_runs
    trained = load_trained_run(runs[method], "latest")  # the weights the run's final evaluation used
    for task, languages in (("xnli", ["en", "de"]), ("nli_copy", ["sw", "ru"])):
        for language in languages:
            rows, where = read_input(trained.config, task, "facebook/xnli", "validation", language)
            predicted = trained.predict(task, rows.select(range(16)), language, where=where)
            expected = read_jsonl(runs[method] / "predictions/validation" / task / f"{language}.jsonl")
            assert [{"id": r["id"], "prediction": r["prediction"]} for r in predicted] == expected, (task, language)


def test_merged_export_gives_mtfts_logits_through_transformers(trained_runs):
    root, runs = trained_runs
    out = root / "merged-multi_lora"
    assert export_run(runs["multi_lora"], out, merge=True) == [out / "xnli", out / "nli_copy"]
    run = load_run(runs["multi_lora"])
    logits = []
    for task in ("xnli", "nli_copy"):
        tokenizer = AutoTokenizer.from_pretrained(str(out / task))
        enc = tokenizer([p for p, _ in TEXTS], [h for _, h in TEXTS], padding=True, return_tensors="pt")
        encoder = AutoModel.from_pretrained(str(out / task)).eval()  # a plain encoder: no PEFT, no LoRA layer
        assert not any("lora" in name for name in encoder.state_dict())
        meta = json.loads((out / task / "head.json").read_text())
        head = build_head(meta["kind"], meta["hidden_size"], meta["label_names"], 0.0).eval()
        head.load_state_dict(load_file(str(out / task / "head.safetensors")))
        with torch.no_grad():
            logits.append(head.logits(encoder(**enc).last_hidden_state))
        ours = run.model.predict_logits(task, enc["input_ids"], enc["attention_mask"])
        torch.testing.assert_close(logits[-1], ours, atol=1e-5, rtol=0)


@pytest.mark.parametrize("method", ["multi_lora", "lora", "head"])
def test_the_transformers_export_loads_with_automodel_and_gives_the_runs_logits(trained_runs, method):
    """--transformers: each task an AutoModelForSequenceClassification of the backbone's family (its adapter merged),
    id2label from the run, the run's logits; every folder with a model card, export.json with max_length."""
    from transformers import AutoModelForSequenceClassification

    root, runs = trained_runs
    out = root / f"transformers-{method}"
    result = run_cli("export", "--run", str(runs[method]), "--out", str(out), "--transformers")
    assert result.returncode == 0, result.stderr[-3000:]
    run = load_run(runs[method])
    for task in ("xnli", "nli_copy"):
        model = AutoModelForSequenceClassification.from_pretrained(str(out / task)).eval()
        tokenizer = AutoTokenizer.from_pretrained(str(out / task))
        enc = tokenizer([p for p, _ in TEXTS], [h for _, h in TEXTS], padding=True, return_tensors="pt")
        assert model.config.id2label == {0: "entailment", 1: "neutral", 2: "contradiction"}
        with torch.no_grad():
            theirs = model(**enc).logits
        ours = run.model.predict_logits(task, enc["input_ids"], enc["attention_mask"])
        torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=0)
        card = (out / task / "README.md").read_text()
        assert card.startswith("---\nlibrary_name: transformers\n") and "pipeline_tag: text-classification" in card
        assert (
            f"| adapter | {method}" in card and "## Evaluation" in card and "AutoModelForSequenceClassification" in card
        )
    export = json.loads((out / "export.json").read_text())
    assert export["format"] == "transformers" and export["max_length"] == {"xnli": 64, "nli_copy": 64}


def test_every_export_has_a_model_card(trained_runs):
    """PEFT's empty template replaced: the base, the task, the languages, labels and metrics, how to load it."""
    root, runs = trained_runs
    out = root / "cards"
    assert export_run(runs["multi_lora"], out)
    card = (out / "xnli" / "README.md").read_text()
    assert "library_name: peft" in card and "| trained on | en, de |" in card
    assert "entailment, neutral, contradiction" in card and "peft.PeftModel.from_pretrained" in card
    assert "base_model: runs/" not in card  # the base is written into the export (../base), not a path elsewhere
    assert json.loads((out / "export.json").read_text())["max_length"] == {"xnli": 64, "nli_copy": 64}
