"""A tiny encoder with task heads, a batch for it, and the loading log of a Transformers call, for the model tests."""

from __future__ import annotations

import logging

import torch

from mtft.config.schema import ModelSection
from mtft.models.backbone import build_encoder
from mtft.models.heads import SequenceClassificationHead
from mtft.models.multitask import MultiTaskModel
from mtft.models.tokenizer import tiny_tokenizer


def tiny_model(tmp_path, num_objectives=3):
    tok = tiny_tokenizer(["alpha beta gamma delta", "epsilon zeta eta theta"] * 10, 100, tmp_path)
    encoder = build_encoder(ModelSection(dropout=0.0), tok, max_length=16, init_seed=0)
    heads = {
        "a": SequenceClassificationHead(64, ["x", "y"], 0.0),
        "b": SequenceClassificationHead(64, ["p", "q", "r"], 0.0),
    }
    return MultiTaskModel(encoder, heads, num_objectives), tok


def batch(tok, heads, objectives, labels, texts=("alpha beta", "gamma delta epsilon", "zeta", "eta theta alpha")):
    """A batch of the first ``len(heads)`` of ``texts`` with its rows' labels, heads and objectives."""
    enc = tok(list(texts[: len(heads)]), padding=True, truncation=True, max_length=16, return_tensors="pt")
    return dict(
        input_ids=enc["input_ids"],
        attention_mask=enc["attention_mask"],
        labels=torch.tensor(labels),
        head_index=torch.tensor(heads),
        objective_index=torch.tensor(objectives),
    )


def collect(name: str):
    """The records of logger ``name`` (mtft's and transformers' loggers do not propagate to the root's)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    log = logging.getLogger(name)
    previous = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    yield records
    log.removeHandler(handler)
    log.setLevel(previous)
