"""Using a finished run (issue 31): ``run.py predict`` and ``mtft.api`` reproduce the run's prediction files for
every task kind, ``run.py evaluate`` its metrics.json and a language it never saw, ``run.py export`` of full
fine-tuning the run's logits through plain ``transformers``, and the README's API example runs.

One short run (6 steps, full fine-tuning of the tiny encoder) holds a task of every kind: XNLI (classification),
WikiANN (tokens), TyDiQA (extractive QA; sw zero-shot), STS-B (regression) and COPA (multiple choice); a second
one, XNLI alone with source_languages as configs/demo.yaml has them, is evaluated without one of its sources
(issue 37). Everything else runs in this process or as one ``run.py`` call each; the adapter methods are covered
in test_export.py on its runs."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModel, AutoTokenizer

from mtft.api import load_run
from mtft.commands import run_command
from mtft.commands.export import export_run
from mtft.data.pipeline import load_task_split
from mtft.tasks.kinds import build_head
from tests.helpers.data import validation_only_copy
from tests.helpers.launch import REPO, run_cli
from tests.helpers.runs import BASE_CONFIG, base_overrides, read_jsonl

SOURCES = {
    "unimelb-nlp/wikiann": "tasks/wikiann/fixtures/wikiann",
    "google-research-datasets/tydiqa": "tasks/tydiqa/fixtures/tydiqa",
    "facebook/xnli": "tasks/xnli/fixtures/xnli",
    "nyu-mll/multi_nli": "tasks/xnli/fixtures/multi_nli",
    "nyu-mll/glue": "tasks/glue/fixtures/glue",
    "aps/super_glue": "tasks/super_glue/fixtures/super_glue",
}
TASKS = [
    {"name": "xnli", "languages": ["en", "de"], "protocol": "in_language", "max_train_examples": 48},
    {"name": "wikiann", "languages": ["en"], "protocol": "in_language", "max_train_examples": 48},
    {
        "name": "tydiqa",
        "languages": ["en", "sw"],
        "protocol": "zero_shot",
        "max_train_examples": 48,
        "max_length": 48,
        "settings": {"doc_stride": 16, "max_question_tokens": 12},
    },
    {"name": "glue_stsb", "max_train_examples": 48},
    {"name": "superglue_copa", "max_train_examples": 48},
]


# a run set up as configs/demo.yaml is: XNLI trained on its source_languages, ar a zero-shot target
SOURCED_TASKS = [
    {
        "name": "xnli",
        "languages": ["en", "de", "ar"],
        "source_languages": ["en", "de"],
        "protocol": "in_language",
        "max_train_examples": 48,
    }
]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return train(tmp_path_factory.mktemp("predict") / "run", TASKS, SOURCES)


@pytest.fixture(scope="module")
def sourced_run(tmp_path_factory) -> Path:
    xnli = {k: v for k, v in SOURCES.items() if k in ("facebook/xnli", "nyu-mll/multi_nli")}
    return train(tmp_path_factory.mktemp("sourced") / "run", SOURCED_TASKS, xnli)


def train(out: Path, tasks: list[dict], sources: dict[str, str]) -> Path:
    """A short run (6 steps) of ``tasks``; evaluated once, at its end."""
    extra = {
        "data.tasks": tasks,
        "data.sources": sources,
        "data.max_length": 48,
        "weighting.method": "mean",
        "training.micro_batch_size": 16,
        "evaluation.every_steps": None,
        "checkpointing.every_steps": None,
    }
    result = run_cli("--config", BASE_CONFIG, *base_overrides(out, 6, **extra))
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_predict_reproduces_the_runs_predictions_for_every_task_kind(run):
    trained = load_run(run)  # best/: the final step's weights (the run evaluates once, at its end)
    hub = {"xnli": "facebook/xnli", "wikiann": "unimelb-nlp/wikiann", "tydiqa": "google-research-datasets/tydiqa"}
    hub |= {"glue_stsb": "nyu-mll/glue", "superglue_copa": "aps/super_glue"}
    for spec in TASKS:
        task = spec["name"]
        for language in spec.get("languages", ["en"]):
            rows = trained.predict_input(task, hub[task], language, split="validation")
            expected = read_jsonl(run / "predictions/validation" / task / f"{language}.jsonl")
            # ids as the data types them (GLUE's idx an integer), the run's predictions files as strings
            assert [{"id": str(r["id"]), "prediction": r["prediction"]} for r in rows] == expected, (task, language)
            if task in ("xnli", "superglue_copa"):
                chosen = [max(r["probabilities"], key=r["probabilities"].get) for r in rows]
                assert chosen == [r["prediction"] for r in rows]
                assert all(abs(sum(r["probabilities"].values()) - 1) < 1e-5 for r in rows)
            if task == "wikiann":
                assert any(r["entities"] for r in rows)
            if task == "tydiqa":  # the answer's offsets in its context
                sources = {hub_id: str(REPO / folder) for hub_id, folder in SOURCES.items()}
                raw, _ = load_task_split(trained.tasks[task].task, "validation", language, "zero_shot", sources, None)
                contexts = dict(zip(raw["id"], raw["context"]))
                spans = [(r["id"], r["answer_start"], r["answer_end"], r["prediction"]) for r in rows]
                assert all(contexts[i][s:e] == text for i, s, e, text in spans if s is not None)
                assert all(text == "" for _, s, _, text in spans if s is None)


def test_predict_command_on_an_unlabelled_file_in_an_untrained_language(run, tmp_path):
    """(A file whose columns do not fit is refused before the model loads: tests/e2e/test_bad_input.py FAST.)"""
    rows = [{"premise": "Le chien dort.", "hypothesis": "Un animal se repose."}, {"premise": "x", "hypothesis": "y"}]
    (tmp_path / "fr.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    out = tmp_path / "fr-predictions.jsonl"
    argv = ["predict", "--run", str(run), "--task", "xnli", "--language", "fr", "--input", str(tmp_path / "fr.jsonl")]
    result = run_cli(*argv, "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    predicted = read_jsonl(out)
    assert [r["id"] for r in predicted] == ["0", "1"] and "predict xnli" in result.stderr  # the progress bar
    assert all(r["prediction"] in ("entailment", "neutral", "contradiction") for r in predicted)
    # the same rows through the API give the same predictions
    assert load_run(run).predict("xnli", rows, language="fr") == predicted
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fr-predictions.jsonl", "fr.jsonl"]  # no .tmp left


def test_evaluate_reproduces_metrics_and_scores_a_language_never_trained_on(run, tmp_path):
    assert run_command("evaluate", ["--run", str(run), "--out", str(tmp_path / "same")]) == 0
    assert json.loads((tmp_path / "same/metrics.json").read_text()) == json.loads((run / "metrics.json").read_text())
    for file in (run / "predictions").rglob("*.jsonl"):
        assert (tmp_path / "same" / file.relative_to(run)).read_text() == file.read_text()
    assert "### superglue_copa" in (tmp_path / "same/report.md").read_text()
    # TyDiQA's Arabic and Finnish were never trained on (zero-shot from English) nor evaluated by the run
    override = "data.tasks.2.languages=[en,ar,fi]"
    assert run_command("evaluate", ["--run", str(run), "--out", str(tmp_path / "new"), override]) == 0
    metrics = json.loads((tmp_path / "new/metrics.json").read_text())
    assert {"tydiqa/ar/f1", "tydiqa/fi/exact_match"} <= set(metrics) and "tydiqa/sw/f1" not in metrics
    assert metrics["tydiqa/en/f1"] == json.loads((run / "metrics.json").read_text())["tydiqa/en/f1"]
    assert (tmp_path / "new/predictions/validation/tydiqa/ar.jsonl").is_file()
    assert not (run / "predictions/validation/tydiqa/ar.jsonl").exists()  # nothing written into the run


def test_an_empty_answer_has_no_offsets(run):
    """A whitespace-only context has nothing to answer with: the empty answer, offsets null as docs/using_a_run.md
    says (its best span was a run of spaces, [3, 3) after stripping), beside an ordinary row."""
    rows = [
        {"id": "blank", "question": "who reads?", "context": "      "},
        {"id": "plain", "question": "who reads?", "context": "Maria Garcia reads the book in Paris."},
    ]
    blank, plain = load_run(run).predict("tydiqa", rows, language="en")
    assert (blank["id"], blank["prediction"], blank["answer_start"], blank["answer_end"]) == ("blank", "", None, None)
    if plain["prediction"]:
        assert rows[1]["context"][plain["answer_start"] : plain["answer_end"]] == plain["prediction"]


def test_evaluate_on_files_without_label_names_takes_the_runs(run, tmp_path):
    """The form docs/using_a_run.md gives: a file pattern through data.sources, whose label column is plain
    integers (no ClassLabel, no card) of a task that declares no label names (WikiANN's tags): the run's heads say
    what the ids mean, and the same rows give the run's own metrics."""
    pattern = str(REPO / "tasks/wikiann/fixtures/wikiann") + "/{name}/{split}.jsonl"
    out = tmp_path / "files"
    override = f"data.sources.unimelb-nlp/wikiann={pattern}"
    assert run_command("evaluate", ["--run", str(run), "--out", str(out), override]) == 0
    ours, theirs = json.loads((out / "metrics.json").read_text()), json.loads((run / "metrics.json").read_text())
    wikiann = {k: v for k, v in theirs.items() if k.startswith("wikiann/") and "majority" not in k}
    assert wikiann and {k: ours[k] for k in wikiann} == wikiann


def test_evaluate_drops_a_trained_source_and_reports_sources_and_targets(sourced_run, tmp_path):
    """The README's ``run.py evaluate ... data.tasks.0.languages=[en,sw]`` on a run trained with source_languages
    [en, de] (as configs/demo.yaml is): en, trained on, is a source and sw a target; with no trained language
    evaluated every language is a target. (A run that trains on such a config is still refused:
    tests/e2e/test_bad_input.py source-not-evaluated.)"""
    own = json.loads((sourced_run / "metrics.json").read_text())
    assert own["languages"] == {"xnli": {"source": ["en", "de"], "target": ["ar"]}}
    out = tmp_path / "sw"
    result = run_cli("evaluate", "--run", str(sourced_run), "--out", str(out), "data.tasks.0.languages=[en,sw]")
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["languages"] == {"xnli": {"source": ["en"], "target": ["sw"]}}
    assert metrics["xnli/source_accuracy"] == metrics["xnli/en/accuracy"] == own["xnli/en/accuracy"]
    assert metrics["xnli/target_accuracy"] == metrics["xnli/sw/accuracy"]
    assert metrics["xnli/transfer_gap_accuracy"] == pytest.approx(
        metrics["xnli/en/accuracy"] - metrics["xnli/sw/accuracy"]
    )
    # the baseline counts the run's training labels, de's too, as the run did
    assert metrics["xnli/en/majority_accuracy"] == own["xnli/en/majority_accuracy"]
    assert (
        run_command(
            "evaluate",
            ["--run", str(sourced_run), "--out", str(tmp_path / "targets"), "data.tasks.0.languages=[ar,sw]"],
        )
        == 0
    )
    metrics = json.loads((tmp_path / "targets/metrics.json").read_text())
    assert metrics["languages"] == {"xnli": {"source": [], "target": ["ar", "sw"]}}
    assert "xnli/source_accuracy" not in metrics and "xnli/transfer_gap_accuracy" not in metrics
    assert metrics["xnli/target_accuracy"] == metrics["xnli/accuracy"]
    assert metrics["xnli/ar/accuracy"] == own["xnli/ar/accuracy"]


def test_evaluate_on_evaluation_only_data_reads_no_training_split(run, tmp_path):
    """data.sources naming data with validation files only -- TyDiQA's through a ``{name}/{split}.jsonl`` pattern,
    XNLI's a Hub-layout folder -- is evaluated as the run evaluated the same rows; XNLI's majority-class baseline,
    whose training labels are not there, is absent and said so, the other tasks' stay."""
    qa = tmp_path / "qa" / "secondary_task"
    qa.mkdir(parents=True)
    shutil.copy(REPO / SOURCES["google-research-datasets/tydiqa"] / "secondary_task/validation.jsonl", qa)
    xnli = validation_only_copy(REPO / SOURCES["facebook/xnli"], tmp_path / "xnli")
    sources = [
        f"data.sources.google-research-datasets/tydiqa={tmp_path}/qa/{{name}}/{{split}}.jsonl",
        f"data.sources.facebook/xnli={xnli}",
    ]
    out = tmp_path / "evaluated"
    result = run_cli("evaluate", "--run", str(run), "--out", str(out), *sources)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "task 'xnli': no majority-class baseline" in result.stderr
    own = json.loads((run / "metrics.json").read_text())
    metrics = json.loads((out / "metrics.json").read_text())
    absent = [key for key in own if key.startswith("xnli/") and "majority_" in key]
    assert "xnli/majority_accuracy" in absent and not set(absent) & set(metrics)
    assert metrics == {key: value for key, value in own.items() if key not in absent}
    for file in (run / "predictions").rglob("*.jsonl"):
        assert (out / file.relative_to(run)).read_text() == file.read_text()


def test_full_fine_tuning_export_gives_the_runs_logits_through_transformers(run, tmp_path):
    out = tmp_path / "exported"
    export_run(run, out)
    trained = load_run(run).loaded
    tokenizer = AutoTokenizer.from_pretrained(str(out / "encoder"))
    encoder = AutoModel.from_pretrained(str(out / "encoder")).eval()
    assert type(encoder) is type(trained.model.encoder)
    enc = tokenizer(["Der Hund schläft nicht.", "the cat is awake"], ["Ein Tier ruht.", "a cat"], padding=True)
    enc = {k: torch.tensor(v) for k, v in enc.items()}
    for task in ("xnli", "wikiann", "tydiqa", "glue_stsb"):
        meta = json.loads((out / task / "head.json").read_text())
        head = build_head(meta["kind"], meta["hidden_size"], meta["label_names"], 0.0).eval()
        head.load_state_dict(load_file(str(out / task / "head.safetensors")))
        with torch.no_grad():
            hidden = encoder(**enc).last_hidden_state
            theirs = head.logits(hidden, attention_mask=enc["attention_mask"])
            ours = trained.model.predict_logits(task, enc["input_ids"], enc["attention_mask"])
        torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=0)


def test_the_readmes_api_example_runs(run, capsys):
    readme = (REPO / "README.md").read_text()
    code = re.search(r"<!-- api-example -->\n```python\n(.*?)```", readme, re.S).group(1)
    exec(code.replace('"runs/demo"', repr(str(run))), {})
    label, probabilities = capsys.readouterr().out.split(" ", 1)
    assert label in ("entailment", "neutral", "contradiction") and label in probabilities


def test_every_task_kind_exports_as_its_transformers_auto_class(run, tmp_path):
    """Full fine-tuning of the tiny XLM-R on five task kinds: --transformers writes each as the AutoModelFor class of
    its kind (sequence classification, regression, token classification, QA, multiple choice), checked against the
    run's logits before it is kept; loaded back here, the same logits."""
    from transformers import (
        AutoModelForMultipleChoice,
        AutoModelForQuestionAnswering,
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
    )

    out = tmp_path / "transformers"
    export_run(run, out, transformers=True)
    trained = load_run(run).loaded
    auto = {
        "xnli": AutoModelForSequenceClassification,
        "glue_stsb": AutoModelForSequenceClassification,
        "wikiann": AutoModelForTokenClassification,
        "tydiqa": AutoModelForQuestionAnswering,
        "superglue_copa": AutoModelForMultipleChoice,
    }
    texts = ["Der Hund schläft nicht.", "the cat is awake"]
    for task, cls in auto.items():
        model = cls.from_pretrained(str(out / task)).eval()
        tokenizer = AutoTokenizer.from_pretrained(str(out / task))
        enc = tokenizer(texts, padding=True, return_tensors="pt")
        with torch.no_grad():
            if task == "superglue_copa":
                theirs = model(**{k: v[None] for k, v in enc.items()}).logits.reshape(-1)
                group = torch.zeros(2, dtype=torch.long)
                ours = trained.model.predict_logits(task, enc["input_ids"], enc["attention_mask"], group_index=group)
            else:
                output = model(**enc)
                ours = trained.model.predict_logits(task, enc["input_ids"], enc["attention_mask"])
                if task == "tydiqa":
                    theirs = torch.stack([output.start_logits, output.end_logits], -1)
                    mask = enc["attention_mask"].bool()
                    theirs, ours = theirs[mask], ours[mask]
                else:
                    theirs = output.logits.reshape(ours.shape)
        torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=0)
        if task == "wikiann":
            assert set(model.config.id2label.values()) == set(trained.heads["wikiann"]["label_names"])
    assert (
        AutoModelForSequenceClassification.from_pretrained(str(out / "glue_stsb")).config.problem_type == "regression"
    )
