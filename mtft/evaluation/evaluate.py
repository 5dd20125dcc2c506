"""Evaluate every (task, language) objective; macro-average each task over its languages.

The head decodes each encoded row; the task post-processes rows back to examples (n-best spans over QA
windows, word-level tags) and scores them against the split's references, exactly as ``run.py score`` does
with the predictions file the run writes.

On several data-parallel processes each rank decodes its share of every objective's batches and the decoded rows
are gathered back into their order (:func:`mtft.core.shards.sharded_map`); post-processing and scoring then run
on every rank on the whole list, so that every rank holds the same :class:`Evaluation` -- the one a single
process computes -- and takes the same best-checkpoint and early-stopping decisions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from statistics import mean
from typing import Any, Optional

import torch

from mtft.core.paths import inside
from mtft.core.shards import sharded_map
from mtft.data.batching import BatchBuilder
from mtft.data.pipeline import DEV, Objective, PreparedData
from mtft.evaluation.scoring import score
from mtft.reporting.logs import logger
from mtft.tasks.hidden import HiddenLabelsError


@dataclass
class Evaluation:
    # "<task>/<language>/<metric>", "<task>/<metric>" (macro over languages), and for a task with targets
    # "<task>/source_<metric>", "<task>/target_<metric>", "<task>/transfer_gap_<metric>" (add_macro_averages)
    metrics: dict[str, float]
    predictions: dict[tuple[str, str], list[dict]]  # (task, language) -> [{"id", "prediction"}]


def evaluate(
    model, data: PreparedData, builder: BatchBuilder, batch_size: int, device, dev: bool = False
) -> Evaluation:
    """Score evaluation.split, or with ``dev`` the examples data.dev_split held out of training (the languages
    trained on only: a zero-shot language has no training examples to hold out)."""
    metrics: dict[str, float] = {}
    predictions: dict[tuple[str, str], list[dict]] = {}
    was_training = model.training
    model.eval()
    for objective in data.eval_objectives(dev):
        td = data.tasks[objective.task]
        outputs = decoded_rows(model, data, builder, objective, batch_size, device, dev)
        if dev:
            encoded, raw = td.dev[objective.language], td.raw_dev[objective.language]
        else:
            encoded, raw = td.eval[objective.language], td.raw_eval[objective.language]
        where = td.origin[DEV if dev else td.eval_split, objective.language]
        by_id = td.task.postprocess(outputs, encoded, raw, td.label_names)
        try:
            references = td.task.references(raw, td.label_names, where)
        except HiddenLabelsError:  # a benchmark test set: predictions for its server, no metric
            references = dict.fromkeys(td.task.split_ids(raw))
            logger.info(f"{where}: labels withheld; predictions written, not scored")
        else:
            for name, value in score(td.task, by_id, references, td.label_names, where).items():
                metrics[f"{objective.key}/{name}"] = value
        predictions[objective.task, objective.language] = [{"id": i, "prediction": by_id[i]} for i in references]
    add_macro_averages(metrics, data, dev)
    model.train(was_training)
    return Evaluation(metrics, predictions)


def decoded_rows(
    model, data: PreparedData, builder: BatchBuilder, objective: Objective, batch_size: int, device, dev: bool
) -> list:
    """The head's decoded output of every encoded evaluation row of ``objective``, in row order; on several
    processes each rank decodes its share of the batches (ZeRO-3-safe: every rank runs as many forward passes)."""
    head = model.heads[data.head_of(objective.task)]  # an evaluation-only task (GLUE AX) borrows another's head

    def decode(index: int) -> list:
        logits, context = batch_logits(model, data, builder, objective, batch_size, index, device, dev)
        return head.decode(logits, **context)

    count = builder.eval_batch_count(objective.task, objective.language, batch_size, dev)
    return [row for rows in sharded_map(count, decode) for row in rows]


def batch_logits(
    model, data: PreparedData, builder: BatchBuilder, objective: Objective, batch_size: int, index: int, device, dev
) -> tuple[Any, dict[str, torch.Tensor]]:
    """(the head's logits, on the CPU, as float; the batch's ``attention_mask`` and ``group_index``, which the
    head's ``decode`` reads) of evaluation slice ``index`` of ``objective`` (``run.py predict`` reads the logits
    themselves too: class probabilities)."""
    head_name = data.head_of(objective.task)
    _, batch = builder.eval_batch(objective.task, objective.language, batch_size, index, dev)
    context = {k: batch[k].to(device) for k in ("attention_mask", "group_index")}
    segments = batch.get("token_type_ids")
    logits = model.predict_logits(
        head_name,
        batch["input_ids"].to(device),
        **context,
        objective=data.eval_objective.get((head_name, objective.language)),
        token_type_ids=None if segments is None else segments.to(device),
    )
    logits = tuple(x.float().cpu() for x in logits) if isinstance(logits, tuple) else logits.float().cpu()
    return logits, {k: v.cpu() for k, v in context.items()}


def add_macro_averages(metrics: dict[str, float], data: PreparedData, dev: bool, prefix: str = "") -> None:
    """``<task>/<prefix><metric>``: the mean of ``<task>/<language>/<prefix><metric>`` over the languages scored.

    A task with target languages (evaluated, never trained on) also gets the macro over its sources,
    ``<task>/<prefix>source_<metric>``, over its targets, ``<task>/<prefix>target_<metric>``, and (the model's
    metrics, no prefix) the transfer gap ``<task>/transfer_gap_<metric>`` = source − target macro. The dev set of
    data.dev_split holds sources only: no split there."""
    for name, td in data.tasks.items():
        for metric in td.task.metrics:
            languages = list(td.dev) if dev else td.languages  # cross-lingual: the dev set is the training language's
            macro = _macro(metrics, name, languages, prefix + metric)
            if macro is not None:
                metrics[f"{name}/{prefix}{metric}"] = macro
            if dev or not td.targets:
                continue
            source = _macro(metrics, name, [lang for lang in languages if lang not in td.targets], prefix + metric)
            target = _macro(metrics, name, td.targets, prefix + metric)
            if source is not None:
                metrics[f"{name}/{prefix}source_{metric}"] = source
            if target is not None:
                metrics[f"{name}/{prefix}target_{metric}"] = target
            if source is not None and target is not None and not prefix:
                metrics[f"{name}/transfer_gap_{metric}"] = source - target


def _macro(metrics: dict[str, float], task: str, languages: list[str], metric: str) -> Optional[float]:
    scored = [metrics[k] for lang in languages if (k := f"{task}/{lang}/{metric}") in metrics]
    return mean(scored) if scored else None


def metrics_record(step: int, metrics: dict[str, float], data: PreparedData) -> dict[str, Any]:
    """What a ``metrics.json`` holds: the step, the metrics and, for the tasks with target languages, which of their
    languages are sources (trained on) and which targets (never trained on)."""
    roles = {
        name: {"source": [lang for lang in td.languages if lang not in td.targets], "target": td.targets}
        for name, td in data.tasks.items()
        if td.targets
    }
    return {"step": step, **metrics, **({"languages": roles} if roles else {})}


def write_predictions(folder: Path, split: str, predictions: dict[tuple[str, str], list[dict]]) -> None:
    """``<folder>/predictions/<split>/<task>/<language>.jsonl``, one ``{"id", "prediction"}`` object a line (what
    ``run.py score`` reads); every name-built path goes through inside(): it cannot leave ``folder``."""
    for (task, lang), rows in predictions.items():
        path = inside(folder, "predictions", split, task, f"{lang}.jsonl")
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
