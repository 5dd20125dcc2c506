"""SURT's text (mtft.data.pipeline.task_training_texts): exactly the text columns of each task's training split --
no label, no id, no evaluation text."""

from __future__ import annotations

from mtft.config import validate_config
from mtft.data.pipeline import load_task_split, task_training_texts
from mtft.data.selection import select_tasks
from tests.helpers.launch import REPO

SOURCES = {
    "facebook/xnli": str(REPO / "tasks/xnli/fixtures/xnli"),
    "nyu-mll/multi_nli": str(REPO / "tasks/xnli/fixtures/multi_nli"),
}


def config(max_train: int = 12):
    task = {"name": "xnli", "languages": ["en", "de"], "protocol": "in_language", "max_train_examples": max_train}
    return validate_config({"data": {"sources": SOURCES, "tasks": [task]}}, source="test")


def test_the_texts_are_the_training_splits_text_columns_and_nothing_else():
    cfg = config()
    task = select_tasks(cfg.data, cfg.evaluation.split)[0].task
    assert list(task.text_columns) == ["premise", "hypothesis"]
    texts = task_training_texts(cfg.data, cfg.evaluation.split)
    expected, labels = [], set()
    for lang in ["en", "de"]:
        train, _ = load_task_split(task, "train", lang, "in_language", SOURCES, None, 12)
        expected += [*train["premise"], *train["hypothesis"]]
        labels |= {str(v) for v in train["label"]}
    assert texts == expected and len(texts) == 2 * 2 * 12
    names = {"entailment", "neutral", "contradiction"}
    assert not (set(texts) & (labels | names))  # no label value nor label name reaches the masked-LM stage
    assert not any(text.split()[-1:] and text.split()[-1] in names for text in texts)  # nor appended to a text


def test_more_training_rows_give_more_text():
    cfg = config(20)
    assert len(task_training_texts(cfg.data, cfg.evaluation.split)) == 2 * 2 * 20
