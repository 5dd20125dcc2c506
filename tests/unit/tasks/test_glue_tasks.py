"""GLUE and SuperGLUE tasks: discovery, loading through the pipeline, encoding, grouping, metric wiring on
hand-checked cases, withheld test labels, and evaluation-only tasks predicted with another task's head."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import f1_score, matthews_corrcoef

from mtft.config import validate_config
from mtft.core.errors import ConfigError, DataError
from mtft.core.labels import IGNORE_INDEX
from mtft.data.batching import BatchBuilder
from mtft.data.sources import load_split
from mtft.evaluation.evaluate import evaluate
from mtft.models.tokenizer import tiny_tokenizer
from mtft.tasks import DatasetRef, discover_tasks
from mtft.tasks.hidden import HIDDEN_ENCODED, HiddenLabelsError
from mtft.training.setup import build_model, heads_metadata
from tests.helpers.data import prepare_for
from tests.helpers.launch import REPO

SOURCES = {
    "nyu-mll/glue": str(REPO / "tasks/glue/fixtures/glue"),
    "aps/super_glue": str(REPO / "tasks/super_glue/fixtures/super_glue"),
}
GLUE = ["cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "mnli_mismatched", "qnli", "rte", "wnli", "ax"]
SUPER_GLUE = ["boolq", "cb", "copa", "multirc", "record", "rte", "wic", "wsc", "axb", "axg"]
ALL = [f"glue_{t}" for t in GLUE] + [f"superglue_{t}" for t in SUPER_GLUE]
TASKS = discover_tasks()


def tokenizer_factory(texts):
    return tiny_tokenizer(texts, 400, Path(os.environ["MTFT_CACHE"]))


def prepare(tasks: list, **data):
    raw = {
        "data": {"sources": SOURCES, "tasks": tasks, "max_length": 96, **data},
        "model": {"tiny": {"vocab_size": 400}},
    }
    return prepare_for(validate_config(raw, source="test"), tokenizer_factory)


@pytest.fixture(scope="module")
def everything():
    """Every GLUE and SuperGLUE task in one run's data (a few rows each)."""
    return prepare([{"name": name, "max_train_examples": 12, "max_eval_examples": 16} for name in ALL])


def test_every_task_is_discovered_with_its_head_and_official_metrics():
    expected = {
        "glue_cola": ("sequence_classification", ["mcc"]),
        "glue_sst2": ("sequence_classification", ["accuracy"]),
        "glue_mrpc": ("sequence_classification", ["f1", "accuracy"]),
        "glue_qqp": ("sequence_classification", ["f1", "accuracy"]),
        "glue_stsb": ("regression", ["pearson", "spearman"]),
        "glue_mnli": ("sequence_classification", ["accuracy"]),
        "glue_mnli_mismatched": ("sequence_classification", ["accuracy"]),
        "glue_qnli": ("sequence_classification", ["accuracy"]),
        "glue_rte": ("sequence_classification", ["accuracy"]),
        "glue_wnli": ("sequence_classification", ["accuracy"]),
        "glue_ax": ("sequence_classification", ["mcc"]),
        "superglue_boolq": ("sequence_classification", ["accuracy"]),
        "superglue_cb": ("sequence_classification", ["accuracy", "macro_f1"]),
        "superglue_copa": ("multiple_choice", ["accuracy"]),
        "superglue_multirc": ("sequence_classification", ["exact_match", "f1a"]),
        "superglue_record": ("candidate_scoring", ["exact_match", "f1"]),
        "superglue_rte": ("sequence_classification", ["accuracy"]),
        "superglue_wic": ("sequence_classification", ["accuracy"]),
        "superglue_wsc": ("sequence_classification", ["accuracy"]),
        "superglue_axb": ("sequence_classification", ["mcc"]),
        "superglue_axg": ("sequence_classification", ["accuracy", "gender_parity"]),
    }
    assert {name: (TASKS[name].head, list(TASKS[name].metrics)) for name in ALL} == expected
    assert all(list(TASKS[name].languages) == ["en"] for name in ALL)
    borrowed = {name: TASKS[name].evaluate_with for name in ALL if TASKS[name].evaluate_with}
    assert borrowed == {
        "glue_mnli_mismatched": "glue_mnli",
        "glue_ax": "glue_mnli",
        "superglue_axb": "superglue_rte",
        "superglue_axg": "superglue_rte",
    }
    assert TASKS["superglue_wsc"].dataset_ref("validation", "en", "in_language").name == "wsc.fixed"
    mm = TASKS["glue_mnli_mismatched"].dataset_ref("validation", "en", "in_language")
    assert (mm.name, mm.split) == ("mnli", "validation_mismatched")


def test_all_tasks_load_with_classlabel_names_and_borrowers_do_not_train(everything):
    data = everything
    names = {name: td.label_names for name, td in data.tasks.items()}
    assert names["glue_wnli"] == ["not_entailment", "entailment"]  # the Hub's order, not RTE's
    assert names["superglue_cb"] == ["entailment", "contradiction", "neutral"]  # not MNLI's
    assert names["glue_stsb"] == [] and names["superglue_record"] == []
    assert names["superglue_copa"] == ["choice1", "choice2"]
    trained = {unit.task for unit in data.train_units}
    assert trained == set(ALL) - {"glue_ax", "glue_mnli_mismatched", "superglue_axb", "superglue_axg"}
    assert data.head_tasks() == [name for name in ALL if not TASKS[name].evaluate_with]
    builder = BatchBuilder(data)
    assert builder.head_of_task["glue_ax"] == builder.head_of_task["glue_mnli"]
    assert builder.head_of_task["superglue_axg"] == builder.head_of_task["superglue_rte"]
    # the evaluation of AX is its (only) test split, whatever evaluation.split says
    assert "nyu-mll/glue (config ax) split test" in data.tasks["glue_ax"].origin["validation", "en"]


def test_stsb_labels_are_floats_and_copa_rows_hold_one_sequence_per_choice(everything):
    stsb = everything.tasks["glue_stsb"]
    raw = load_split(DatasetRef("nyu-mll/glue", "train", "stsb"), SOURCES).select(range(12))
    assert stsb.train["en"]["labels"] == pytest.approx(raw["label"])
    copa = everything.tasks["superglue_copa"]
    row, source = copa.train["en"][0], copa.raw_train["en"][0]
    assert len(row["input_ids"]) == 2 and row["labels"] == source["label"] and row["id"] == str(source["idx"])
    first = everything.tokenizer.decode(row["input_ids"][0], skip_special_tokens=True)
    assert f"What was the {source['question']}?" in first.replace(" ?", "?")
    batch = BatchBuilder(everything).collate(
        [copa.train["en"][i] for i in range(3)], [BatchBuilder(everything).head_of_task["superglue_copa"]] * 3
    )
    assert batch["group_index"].tolist() == [0, 0, 1, 1, 2, 2]


def test_record_encodes_one_row_per_candidate_and_picks_the_best_per_query(everything):
    td = everything.tasks["superglue_record"]
    raw, encoded = td.raw_eval["en"], td.eval["en"]
    assert len(encoded) == sum(len(set(e)) for e in raw["entities"])
    for query in raw.select(range(3)):
        key = f"{query['idx']['passage']}-{query['idx']['query']}"
        rows = [r for r in encoded if r["id"] == key]
        assert [r["candidate"] for r in rows] == list(dict.fromkeys(query["entities"]))
        assert [r["candidate"] for r in rows if r["labels"] == 1] == [
            e for e in dict.fromkeys(query["entities"]) if e in query["answers"]
        ]
    # scores: the second candidate of query A and the first of query B are best
    fake = encoded.select(range(0)).from_dict({"id": ["A", "A", "A", "B", "B"], "candidate": ["x", "y", "z", "u", "v"]})
    predictions = td.task.postprocess([0.1, 2.0, -1.0, 0.5, 0.5], fake, raw, [])
    assert predictions == {"A": "y", "B": "u"}  # a tie keeps the first
    references = td.task.references(raw, [], "test")
    assert all(isinstance(v, list) and v for v in references.values())


def test_multirc_options_are_grouped_by_paragraph_and_question(everything):
    td = everything.tasks["superglue_multirc"]
    references = td.task.references(td.raw_eval["en"], td.label_names, "test")
    first = td.raw_eval["en"][0]["idx"]
    key = f"{first['paragraph']}-{first['question']}-{first['answer']}"
    assert references[key]["question"] == f"{first['paragraph']}-{first['question']}"
    assert td.eval["en"]["id"][:3] == list(references)[:3]


def test_wic_and_wsc_mark_their_spans(everything):
    decode = everything.tokenizer.decode
    wic = everything.tasks["superglue_wic"]
    source = wic.raw_eval["en"][0]
    text = decode(wic.eval["en"][0]["input_ids"], skip_special_tokens=True).replace(" ", "")
    assert f"*{source['word']}*" in text and text.count("*") == 4
    wsc = everything.tasks["superglue_wsc"]
    source = wsc.raw_eval["en"][0]
    text = decode(wsc.eval["en"][0]["input_ids"], skip_special_tokens=True).replace(" ", "")
    assert f"*{source['span1_text'].replace(' ', '')}*" in text and "#it#" in text


# ----- metric wiring, hand-checked ------------------------------------------------------------------------
A, U, EQ, NE = "acceptable", "unacceptable", "equivalent", "not_equivalent"


def test_glue_metrics_per_task():
    # CoLA: TP 1, FN 1, TN 2, FP 0 (acceptable positive): MCC = (1*2 - 0*1) / sqrt(1*2*2*3)
    assert TASKS["glue_cola"].compute_metrics([A, U, U, U], [A, A, U, U]) == {"mcc": pytest.approx(2 / 12**0.5)}
    # MRPC: F1 of "equivalent" (TP 2, FP 1, FN 0: P 2/3, R 1 -> 0.8), not of the other class (2/3)
    assert TASKS["glue_mrpc"].compute_metrics([EQ, EQ, EQ, NE], [EQ, EQ, NE, NE]) == {
        "f1": pytest.approx(0.8),
        "accuracy": 0.75,
    }
    qqp = TASKS["glue_qqp"].compute_metrics(["duplicate", "not_duplicate"], ["duplicate", "duplicate"])
    assert qqp == {"f1": pytest.approx(2 / 3), "accuracy": 0.5}
    predictions, references = [0.5, 0.4, 2.5, 3.5], [0.0, 1.0, 2.0, 3.0]
    stsb = TASKS["glue_stsb"].compute_metrics(predictions, references)
    assert stsb["spearman"] == pytest.approx(0.8)  # rank differences 1,1,0,0: 1 - 6*2/(4*15)
    assert stsb["pearson"] == pytest.approx(pearsonr(predictions, references)[0])
    assert stsb["spearman"] == pytest.approx(spearmanr(predictions, references)[0])


def test_superglue_metrics_per_task():
    # CB: accuracy 3/4; F1 per class: entailment 0.8, contradiction 1, neutral 0 -> macro 0.6
    cb = TASKS["superglue_cb"].compute_metrics(
        ["entailment", "contradiction", "entailment", "entailment"],
        ["entailment", "contradiction", "neutral", "entailment"],
    )
    assert cb == {"accuracy": 0.75, "macro_f1": pytest.approx(0.6)}
    # MultiRC: question q1 all right, q2 one option wrong -> EM 1/2; options: TP 2, FN 1, FP 0 -> F1a 0.8
    refs = [
        {"label": "True", "question": "0-0"},
        {"label": "False", "question": "0-0"},
        {"label": "True", "question": "0-1"},
        {"label": "True", "question": "0-1"},
    ]
    multirc = TASKS["superglue_multirc"].compute_metrics(["True", "False", "True", "False"], refs)
    assert multirc == {"exact_match": 0.5, "f1a": pytest.approx(0.8)}
    # ReCoRD: max over gold (the surname alone is a gold answer); "Oslo" vs "Lisbon" scores 0
    record = TASKS["superglue_record"].compute_metrics(["Petrov", "Oslo"], [["Noah Petrov", "Petrov"], ["Lisbon"]])
    assert record == {"exact_match": 0.5, "f1": 0.5}
    # AX-g: accuracy 3/4; pairs (0,1) agree, (2,3) disagree -> parity 1/2
    refs = [{"label": "entailment", "idx": i} for i in range(4)]
    axg = TASKS["superglue_axg"].compute_metrics(["entailment", "entailment", "entailment", "not_entailment"], refs)
    assert axg == {"accuracy": 0.75, "gender_parity": 0.5}
    assert TASKS["superglue_axb"].compute_metrics(
        ["entailment", "not_entailment"], ["entailment", "not_entailment"]
    ) == {"mcc": 1.0}


# ----- withheld labels and borrowed heads -------------------------------------------------------------------
def test_withheld_test_labels_are_encoded_without_loss_and_never_scored():
    data = prepare(
        [
            {"name": "glue_cola", "max_train_examples": 8, "max_eval_examples": 8},
            {"name": "superglue_record", "max_train_examples": 4, "max_eval_examples": 4},
        ],
        **{"max_length": 64},
    )
    assert HIDDEN_ENCODED == IGNORE_INDEX
    cola = data.tasks["glue_cola"]
    raw = load_split(DatasetRef("nyu-mll/glue", "test", "cola"), SOURCES)
    with pytest.raises(HiddenLabelsError, match=r"split test.*labels of this split are withheld.*cannot be scored"):
        cola.task.references(raw, cola.label_names, "nyu-mll/glue (config cola) split test")
    assert cola.task.label_ids([-1, 1], cola.label_names, "x", [0, 1]) == [IGNORE_INDEX, 1]
    mixed = raw.select(range(3)).map(lambda row, i: {"label": 1 if i == 1 else row["label"]}, with_indices=True)
    with pytest.raises(DataError, match="row 0: label withheld"):
        cola.task.references(mixed, cola.label_names, "mixed")
    record = data.tasks["superglue_record"]
    raw = load_split(DatasetRef("aps/super_glue", "test", "record"), SOURCES)
    with pytest.raises(HiddenLabelsError):
        record.task.references(raw, [], "record test")


def test_training_on_a_withheld_split_is_refused(tmp_path):
    with pytest.raises(DataError, match="withheld.*cannot be trained on"):
        prepare(
            [{"name": "glue_rte", "max_train_examples": 8, "max_eval_examples": 8}],
            sources={**SOURCES},
            task_dirs=[str(_task_training_on_test(tmp_path))],
        )


def _task_training_on_test(tmp_path: Path) -> Path:
    text = (REPO / "tasks/glue/rte.yaml").read_text().replace("split: train}", "split: test}")
    (tmp_path / "rte.yaml").write_text(text)
    return tmp_path


def test_an_evaluation_only_task_needs_the_task_whose_head_it_uses():
    with pytest.raises(ConfigError, match="glue_ax.*evaluated with the head of task 'glue_mnli'; add 'glue_mnli'"):
        prepare([{"name": "glue_ax", "max_eval_examples": 8}])


def test_ax_is_predicted_by_the_mnli_head_and_reported_without_a_metric():
    data = prepare(
        [
            {"name": "glue_mnli", "max_train_examples": 8, "max_eval_examples": 10},
            {"name": "glue_mnli_mismatched", "max_eval_examples": 10},
            {"name": "glue_ax", "max_eval_examples": 10},
        ],
        max_length=64,
    )
    raw = {
        "data": {"sources": SOURCES, "tasks": [{"name": "glue_mnli"}], "max_length": 64},
        "model": {"tiny": {"vocab_size": 400, "hidden_size": 16, "num_attention_heads": 2, "intermediate_size": 32}},
    }
    model = build_model(validate_config(raw, source="test"), data)
    assert list(model.heads) == ["glue_mnli"] and list(heads_metadata(data)) == ["glue_mnli"]
    result = evaluate(model, data, BatchBuilder(data), 4, "cpu")
    assert set(result.metrics) == {
        "glue_mnli/en/accuracy",
        "glue_mnli/accuracy",
        "glue_mnli_mismatched/en/accuracy",
        "glue_mnli_mismatched/accuracy",
    }  # AX: labels withheld on the Hub
    ax = result.predictions["glue_ax", "en"]
    assert [p["id"] for p in ax] == [str(i) for i in range(10)]
    assert {p["prediction"] for p in ax} <= {"entailment", "neutral", "contradiction"}


# ----- run.py score ------------------------------------------------------------------------------------------
def score_cli(capsys, *argv: str) -> dict:
    from mtft.commands import run_command

    assert run_command("score", list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def write_predictions(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps({"id": i, "prediction": p}) + "\n" for i, p in rows))
    return path


def test_score_glue_ax_says_its_labels_are_withheld_and_scores_a_labelled_copy(tmp_path, capsys):
    ax = load_split(DatasetRef("nyu-mll/glue", "test", "ax"), SOURCES)
    names = ["entailment", "neutral", "contradiction"]
    predicted = [names[i % 3] for i in range(len(ax))]
    predictions = write_predictions(tmp_path / "ax.jsonl", [(str(i), p) for i, p in zip(ax["idx"], predicted)])
    with pytest.raises(HiddenLabelsError, match=r"glue \(config ax\) split test.*withheld.*labelled references"):
        score_cli(
            capsys,
            "--task",
            "glue_ax",
            "--predictions",
            str(predictions),
            "--references",
            SOURCES["nyu-mll/glue"],
            "--split",
            "test",
        )
    # a labelled copy of AX (e.g. GLUE's diagnostic-full.tsv converted), labels as names: scored with MCC
    gold = [names[(i * 7) % 3] if i % 4 else predicted[i] for i in range(len(ax))]
    copy = tmp_path / "ax_labelled.jsonl"
    copy.write_text(
        "".join(
            json.dumps({"premise": r["premise"], "hypothesis": r["hypothesis"], "label": g, "idx": r["idx"]}) + "\n"
            for r, g in zip(ax, gold)
        )
    )
    scored = score_cli(
        capsys, "--task", "glue_ax", "--predictions", str(predictions), "--references", str(copy), "--split", "test"
    )
    assert scored["mcc"] == pytest.approx(matthews_corrcoef(gold, predicted)) and scored["examples"] == len(ax)


def test_score_superglue_record_with_max_over_gold(tmp_path, capsys):
    record = load_split(DatasetRef("aps/super_glue", "validation", "record"), SOURCES)
    ids = [f"{r['passage']}-{r['query']}" for r in record["idx"]]
    # a surname alone is right when the full name is masked; every tenth prediction is wrong
    rows = [(key, answers[-1] if k % 10 else "nobody") for k, (key, answers) in enumerate(zip(ids, record["answers"]))]
    scored = score_cli(
        capsys,
        "--task",
        "superglue_record",
        "--predictions",
        str(write_predictions(tmp_path / "record.jsonl", rows)),
        "--references",
        SOURCES["aps/super_glue"],
    )
    assert scored["exact_match"] == pytest.approx(0.9) and scored["f1"] == pytest.approx(0.9)
    bad = write_predictions(tmp_path / "bad.jsonl", rows + [("999-999", "x")])
    with pytest.raises(DataError, match=r"bad.jsonl: row 81: task 'superglue_record': unknown example id '999-999'"):
        score_cli(
            capsys, "--task", "superglue_record", "--predictions", str(bad), "--references", SOURCES["aps/super_glue"]
        )


def test_score_glue_cola_and_mrpc_against_the_fixture(tmp_path, capsys):
    for task, config, positive in (("glue_cola", "cola", None), ("glue_mrpc", "mrpc", "equivalent")):
        raw = load_split(DatasetRef("nyu-mll/glue", "validation", config), SOURCES)
        names = raw.features["label"].names
        gold = [names[i] for i in raw["label"]]
        predicted = [g if k % 5 else names[1 - names.index(g)] for k, g in enumerate(gold)]  # every fifth flipped
        rows = [(str(i), p) for i, p in zip(raw["idx"], predicted)]
        scored = score_cli(
            capsys,
            "--task",
            task,
            "--predictions",
            str(write_predictions(tmp_path / "p.jsonl", rows)),
            "--references",
            SOURCES["nyu-mll/glue"],
        )
        if positive:
            assert scored["f1"] == pytest.approx(f1_score(gold, predicted, pos_label=positive))
            assert scored["accuracy"] == pytest.approx(0.8)
        else:
            assert scored["mcc"] == pytest.approx(matthews_corrcoef(gold, predicted))


def test_a_withheld_split_with_duplicate_ids_stops_the_run_at_load(tmp_path):
    rows = [{"premise": "A b.", "hypothesis": "A.", "label": -1, "idx": i} for i in (0, 1, 1)]
    copy = tmp_path / "ax.jsonl"
    copy.write_text("".join(json.dumps(r) + "\n" for r in rows))
    folder = tmp_path / "tasks"
    folder.mkdir()
    (folder / "ax.yaml").write_text((REPO / "tasks/glue/ax.yaml").read_text().replace("nyu-mll/glue", "local/ax"))
    with pytest.raises(DataError, match=r"ax.jsonl.*row 2: duplicate example id '1'"):
        prepare(
            [{"name": "glue_mnli", "max_train_examples": 8, "max_eval_examples": 8}, {"name": "glue_ax"}],
            sources={**SOURCES, "local/ax": str(copy)},
            task_dirs=[str(folder)],
        )
