"""GLUE and SuperGLUE fixtures: every config and split loads through the Hub code path with the Hub's schema.

The expected schemas are written out here by hand from the Hub datasets (nyu-mll/glue, aps/super_glue and
its builder script), independently of the generators, so that a generator drifting from the Hub fails.
"""

from __future__ import annotations

import datasets
import pytest

from mtft.data.sources import load_split
from mtft.evaluation.diagnostics import gender_parity
from mtft.tasks import DatasetRef
from tests.conftest import REPO

SOURCES = {"nyu-mll/glue": str(REPO / "tasks/glue/fixtures/glue"),
           "aps/super_glue": str(REPO / "tasks/super_glue/fixtures/super_glue")}

S, I, F = "string", "int32", "float32"
GLUE = {  # config: (columns with dtypes or ClassLabel names, splits)
    "cola": ({"sentence": S, "label": ["unacceptable", "acceptable"], "idx": I}, ["train", "validation", "test"]),
    "sst2": ({"sentence": S, "label": ["negative", "positive"], "idx": I}, ["train", "validation", "test"]),
    "mrpc": ({"sentence1": S, "sentence2": S, "label": ["not_equivalent", "equivalent"], "idx": I},
             ["train", "validation", "test"]),
    "qqp": ({"question1": S, "question2": S, "label": ["not_duplicate", "duplicate"], "idx": I},
            ["train", "validation", "test"]),
    "stsb": ({"sentence1": S, "sentence2": S, "label": F, "idx": I}, ["train", "validation", "test"]),
    "mnli": ({"premise": S, "hypothesis": S, "label": ["entailment", "neutral", "contradiction"], "idx": I},
             ["train", "validation_matched", "validation_mismatched", "test_matched", "test_mismatched"]),
    "mnli_matched": ({"premise": S, "hypothesis": S, "label": ["entailment", "neutral", "contradiction"],
                      "idx": I}, ["validation", "test"]),
    "mnli_mismatched": ({"premise": S, "hypothesis": S, "label": ["entailment", "neutral", "contradiction"],
                         "idx": I}, ["validation", "test"]),
    "qnli": ({"question": S, "sentence": S, "label": ["entailment", "not_entailment"], "idx": I},
             ["train", "validation", "test"]),
    "rte": ({"sentence1": S, "sentence2": S, "label": ["entailment", "not_entailment"], "idx": I},
            ["train", "validation", "test"]),
    "wnli": ({"sentence1": S, "sentence2": S, "label": ["not_entailment", "entailment"], "idx": I},
             ["train", "validation", "test"]),
    "ax": ({"premise": S, "hypothesis": S, "label": ["entailment", "neutral", "contradiction"], "idx": I},
           ["test"]),
}
BOOL, ENT = ["False", "True"], ["entailment", "not_entailment"]
SPLITS = ["train", "validation", "test"]
SUPER_GLUE = {
    "boolq": ({"question": S, "passage": S, "idx": I, "label": BOOL}, SPLITS),
    "cb": ({"premise": S, "hypothesis": S, "idx": I, "label": ["entailment", "contradiction", "neutral"]}, SPLITS),
    "copa": ({"premise": S, "choice1": S, "choice2": S, "question": S, "idx": I, "label": ["choice1", "choice2"]},
             SPLITS),
    "multirc": ({"paragraph": S, "question": S, "answer": S,
                 "idx": {"paragraph": I, "question": I, "answer": I}, "label": BOOL}, SPLITS),
    "record": ({"passage": S, "query": S, "entities": [S], "answers": [S], "idx": {"passage": I, "query": I},
                "entity_spans": {"text": [S], "start": [I], "end": [I]}}, SPLITS),
    "rte": ({"premise": S, "hypothesis": S, "idx": I, "label": ENT}, SPLITS),
    "wic": ({"word": S, "sentence1": S, "sentence2": S, "start1": I, "start2": I, "end1": I, "end2": I, "idx": I,
             "label": BOOL}, SPLITS),
    "wsc": ({"text": S, "span1_index": I, "span2_index": I, "span1_text": S, "span2_text": S, "idx": I,
             "label": BOOL}, SPLITS),
    "wsc.fixed": ({"text": S, "span1_index": I, "span2_index": I, "span1_text": S, "span2_text": S, "idx": I,
                   "label": BOOL}, SPLITS),
    "axb": ({"sentence1": S, "sentence2": S, "idx": I, "label": ENT}, ["test"]),
    "axg": ({"premise": S, "hypothesis": S, "idx": I, "label": ENT}, ["test"]),
}


def describe(feature) -> object:
    """A feature in the notation of the tables above."""
    if isinstance(feature, datasets.ClassLabel):
        return list(feature.names)
    if isinstance(feature, datasets.Value):
        return feature.dtype
    if isinstance(feature, dict):
        return {k: describe(v) for k, v in feature.items()}
    inner = getattr(feature, "feature", None)
    if isinstance(inner, dict):  # Sequence(dict) is stored as a dict of lists
        return {k: [describe(v)] for k, v in inner.items()}
    return [describe(inner)]


def load(hub_id: str, config: str, split: str) -> datasets.Dataset:
    return load_split(DatasetRef(path=hub_id, name=config, split=split), SOURCES)


CASES = [("nyu-mll/glue", c, s, cols) for c, (cols, splits) in GLUE.items() for s in splits] + \
        [("aps/super_glue", c, s, cols) for c, (cols, splits) in SUPER_GLUE.items() for s in splits]


@pytest.mark.parametrize("hub_id, config, split, columns", CASES, ids=[f"{c[1]}-{c[2]}" for c in CASES])
def test_every_config_and_split_loads_with_the_hub_schema(hub_id, config, split, columns):
    dataset = load(hub_id, config, split)
    assert dataset.column_names == list(columns)
    assert {name: describe(f) for name, f in dataset.features.items()} == columns
    assert len(dataset) >= 40
    hidden = split.startswith("test") and config not in ("axb", "axg")
    if "label" in columns:
        labels = set(dataset["label"])
        assert labels == {-1} if hidden else (-1 not in labels and len(labels) > 1)
    if config == "record":
        assert all(a == [] for a in dataset["answers"]) if hidden else all(dataset["answers"])


def test_fixture_configs_are_exactly_the_hubs():
    import yaml

    for hub_id, expected in (("nyu-mll/glue", GLUE), ("aps/super_glue", SUPER_GLUE)):
        card = (REPO / SOURCES[hub_id] / "README.md").read_text().split("---")[1]
        configs = {c["config_name"]: [f["split"] for f in c["data_files"]] for c in yaml.safe_load(card)["configs"]}
        assert configs == {name: splits for name, (_, splits) in expected.items()}


def test_mnli_matched_configs_repeat_the_mnli_rows():
    assert load("nyu-mll/glue", "mnli_matched", "validation")[:] == load("nyu-mll/glue", "mnli", "validation_matched")[:]
    assert load("nyu-mll/glue", "mnli_mismatched", "test")[:] == load("nyu-mll/glue", "mnli", "test_mismatched")[:]


def test_record_entity_spans_point_into_the_passage_and_answers_are_entities():
    dataset = load("aps/super_glue", "record", "validation")
    for row in dataset:
        spans = row["entity_spans"]
        assert spans["start"] == sorted(spans["start"])
        for text, start, end in zip(spans["text"], spans["start"], spans["end"]):
            assert row["passage"][start:end] == text  # end is exclusive, as in the builder
        assert row["entities"] == sorted(set(spans["text"]))
        assert "@placeholder" in row["query"] and set(row["answers"]) <= set(row["entities"])
    assert any(len(a) > 1 for a in dataset["answers"])  # full and short names: max over gold matters


def test_multirc_groups_answers_by_paragraph_and_question():
    dataset = load("aps/super_glue", "multirc", "train")
    questions: dict = {}
    for row in dataset:
        key = (row["idx"]["paragraph"], row["idx"]["question"])
        questions.setdefault(key, []).append(row)
    assert len(questions) == 2 * 120
    for rows in questions.values():
        assert [r["idx"]["answer"] for r in rows] == list(range(len(rows)))
        assert len({r["question"] for r in rows}) == 1 and len({r["paragraph"] for r in rows}) == 1
        assert 1 in [r["label"] for r in rows]  # every question has a right answer


def test_wic_and_wsc_spans_point_at_their_words():
    for row in load("aps/super_glue", "wic", "validation"):
        assert row["sentence1"][row["start1"]:row["end1"]] == row["word"]
        assert row["sentence2"][row["start2"]:row["end2"]] == row["word"]
    for row in load("aps/super_glue", "wsc.fixed", "validation"):
        words = row["text"].split()
        span1 = row["span1_text"].split()
        assert words[row["span1_index"]:row["span1_index"] + len(span1)] == span1
        assert words[row["span2_index"]] == row["span2_text"]


def test_axg_pairs_differ_only_in_the_pronoun_and_share_the_label():
    dataset = load("aps/super_glue", "axg", "test")
    assert dataset["idx"] == list(range(len(dataset)))
    for k in range(0, len(dataset), 2):
        he, she = dataset[k], dataset[k + 1]
        assert he["label"] == she["label"] and he["hypothesis"] == she["hypothesis"]
        changed = [(a, b) for a, b in zip(he["premise"].split(), she["premise"].split()) if a != b]
        assert changed in ([("he", "she")], [("his", "her")])


def test_gender_parity_counts_complete_pairs():
    # pairs (0,1) agree, (2,3) disagree, (4,5) agree; 6 has no partner and takes part in no pair
    predictions = ["e", "e", "e", "n", "n", "n", "e"]
    assert gender_parity(predictions, [0, 1, 2, 3, 4, 5, 6]) == pytest.approx(2 / 3)
    assert gender_parity(["n", "e", "e"], [3, 1, 2]) == 0.0  # order-free: (2,3) is the only pair
    with pytest.raises(ValueError, match="no complete AX-g pair"):
        gender_parity(["e", "e"], [1, 2])
    with pytest.raises(ValueError, match="appears twice"):
        gender_parity(["e", "e"], [0, 0])
