"""Evaluate every (task, language) objective; macro-average each task over its languages.

The head decodes each encoded row; the task post-processes rows back to examples (n-best spans over QA
windows, word-level tags) and scores them against the split's references, exactly as ``run.py score`` does
with the predictions file the run writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import mean

from mtft.data.batching import BatchBuilder
from mtft.data.pipeline import PreparedData
from mtft.evaluation.scoring import score


@dataclass
class Evaluation:
    metrics: dict[str, float]  # "<task>/<language>/<metric>" and "<task>/<metric>" (macro over languages)
    predictions: dict[tuple[str, str], list[dict]]  # (task, language) -> [{"id", "prediction"}]


def evaluate(model, data: PreparedData, builder: BatchBuilder, batch_size: int, device) -> Evaluation:
    metrics: dict[str, float] = {}
    predictions: dict[tuple[str, str], list[dict]] = {}
    was_training = model.training
    model.eval()
    for objective in data.eval_objectives():
        td = data.tasks[objective.task]
        head = model.heads[objective.task]
        outputs = []
        for _, batch in builder.eval_batches(objective.task, objective.language, batch_size):
            context = {k: batch[k].to(device) for k in ("attention_mask", "group_index")}
            logits = model.predict_logits(objective.task, batch["input_ids"].to(device), **context)
            logits = tuple(x.float().cpu() for x in logits) if isinstance(logits, tuple) else logits.float().cpu()
            outputs += head.decode(logits, **{k: v.cpu() for k, v in context.items()})
        encoded, raw = td.eval[objective.language], td.raw_eval[objective.language]
        where = td.origin[td.eval_split, objective.language]
        by_id = td.task.postprocess(outputs, encoded, raw, td.label_names)
        references = td.task.references(raw, td.label_names, where)
        for name, value in score(td.task, by_id, references, td.label_names, where).items():
            metrics[f"{objective.key}/{name}"] = value
        predictions[objective.task, objective.language] = [{"id": i, "prediction": by_id[i]} for i in references]
    for name, td in data.tasks.items():
        for metric in td.task.metrics:
            metrics[f"{name}/{metric}"] = mean(metrics[f"{name}/{lang}/{metric}"] for lang in td.languages)
    model.train(was_training)
    return Evaluation(metrics, predictions)

