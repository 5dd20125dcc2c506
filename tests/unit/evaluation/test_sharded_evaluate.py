"""Two gloo processes evaluating the same model share the batches and return exactly the one-process evaluation:
the same decoded rows in the same order, the same metrics and predictions, on both ranks -- with uneven batch
counts (one objective of a single batch, which the second rank only pads) and every decode kind (labels,
per-token tags, QA score lists over windows)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from mtft.config import validate_config
from mtft.data.batching import BatchBuilder
from mtft.evaluation.evaluate import decoded_rows, evaluate
from mtft.models.tokenizer import tiny_tokenizer
from mtft.training.setup import build_model
from tests.helpers.data import prepare_for
from tests.helpers.launch import REPO, free_port, run_ranks

WORLD = 2
BATCH = 4
TASKS = [
    # 9 rows a language: 3 batches (rank 0 runs two, rank 1 one and a padding pass)
    {"name": "xnli", "languages": ["en", "de"], "protocol": "in_language", "max_train_examples": 8},
    # 3 rows: 1 batch, which rank 1 only pads
    {"name": "wikiann", "languages": ["en"], "protocol": "in_language", "max_train_examples": 8},
    {
        "name": "tydiqa",
        "languages": ["en"],
        "protocol": "in_language",
        "max_train_examples": 8,
        "settings": {"doc_stride": 16, "max_question_tokens": 16},  # several windows per context at max_length 48
    },
]
EVAL_EXAMPLES = {"xnli": 9, "wikiann": 3, "tydiqa": 6}


def config():
    tasks = [{**t, "max_eval_examples": EVAL_EXAMPLES[t["name"]]} for t in TASKS]
    raw = {
        "data": {
            "sources": {
                "facebook/xnli": str(REPO / "tasks/xnli/fixtures/xnli"),
                "nyu-mll/multi_nli": str(REPO / "tasks/xnli/fixtures/multi_nli"),
                "unimelb-nlp/wikiann": str(REPO / "tasks/wikiann/fixtures/wikiann"),
                "google-research-datasets/tydiqa": str(REPO / "tasks/tydiqa/fixtures/tydiqa"),
            },
            "tasks": tasks,
            "max_length": 48,
        },
        "model": {"tiny": {"vocab_size": 400, "hidden_size": 16, "num_attention_heads": 2, "intermediate_size": 32}},
    }
    return validate_config(raw, source="test")


def prepare():
    # a small vocabulary: BPE keeps whole words of the fixtures as one token each, and the QA contexts must need
    # several windows at max_length 48
    return prepare_for(config(), lambda texts: tiny_tokenizer(texts, 120, Path(os.environ["MTFT_CACHE"])))


def _worker(rank: int, port: int) -> None:
    torch.set_num_threads(1)  # the same kernels, so the same logits, in both evaluations of this process
    data = prepare()  # read from the cache the parent filled
    torch.manual_seed(0)
    model = build_model(config(), data).eval()  # evaluate() switches to eval mode; decoded_rows() alone does not
    builder = BatchBuilder(data)
    objectives = data.eval_objectives()
    alone = [decoded_rows(model, data, builder, o, BATCH, "cpu", dev=False) for o in objectives]
    reference = evaluate(model, data, builder, BATCH, "cpu")

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        forwards = 0
        predict = model.predict_logits

        def counted(*args, **kwargs):
            nonlocal forwards
            forwards += 1
            return predict(*args, **kwargs)

        model.predict_logits = counted
        shared = [decoded_rows(model, data, builder, o, BATCH, "cpu", dev=False) for o in objectives]
        result = evaluate(model, data, builder, BATCH, "cpu")
        counts = [builder.eval_batch_count(o.task, o.language, BATCH) for o in objectives]
        # each rank ran ⌈n/2⌉ passes per objective (twice: decoded_rows, then evaluate), not n
        assert forwards == 2 * sum(-(-n // WORLD) for n in counts) < 2 * sum(counts)
        assert shared == alone  # every decoded row, QA score lists included, bit for bit and in order
        assert result.metrics == reference.metrics
        assert result.predictions == reference.predictions
        both = [None] * WORLD
        torch.distributed.all_gather_object(both, (result.metrics, result.predictions))
        assert both[0] == both[1]  # every rank takes the same early-stopping and best/ decisions
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.timeout(300)
def test_two_gloo_ranks_evaluate_exactly_like_one_process():
    data = prepare()  # fills the tokenizer and datasets caches before the ranks read them
    builder = BatchBuilder(data)
    counts = {(o.task, o.language): builder.eval_batch_count(o.task, o.language, BATCH) for o in data.eval_objectives()}
    assert counts["xnli", "en"] == counts["xnli", "de"] == 3 and counts["wikiann", "en"] == 1  # uneven; padding only
    assert len(data.tasks["tydiqa"].eval["en"]) > EVAL_EXAMPLES["tydiqa"]  # several windows of one context
    assert counts["tydiqa", "en"] > 1
    predictions = evaluate(build_model(config(), data), data, builder, BATCH, "cpu").predictions
    assert len({str(row["prediction"]) for row in predictions["tydiqa", "en"]}) > 1  # order shows in the result
    run_ranks(_worker, (free_port(),), WORLD)
