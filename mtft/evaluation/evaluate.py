"""Evaluate every (task, language) objective; macro-average each task over its languages."""

from __future__ import annotations

from dataclasses import dataclass
from statistics import mean


from mtft.data.batching import BatchBuilder
from mtft.data.pipeline import PreparedData


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
        task_data = data.tasks[objective.task]
        head = model.heads[objective.task]
        ids, predicted = [], []
        for batch_ids, batch in builder.eval_batches(objective.task, objective.language, batch_size):
            logits = model.predict_logits(
                objective.task, batch["input_ids"].to(device), batch["attention_mask"].to(device),
                objective=data.eval_objective.get((objective.task, objective.language)),
            )
            predicted += head.decode(logits.float().cpu())
            ids += batch_ids
        labels = task_data.eval[objective.language]["labels"]
        references = [task_data.label_names[i] for i in labels]
        for name, value in task_data.task.compute_metrics(predicted, references).items():
            metrics[f"{objective.key}/{name}"] = value
        predictions[objective.task, objective.language] = [
            {"id": i, "prediction": p} for i, p in zip(ids, predicted)
        ]
    for name, task_data in data.tasks.items():
        for metric in task_data.task.metrics:
            metrics[f"{name}/{metric}"] = mean(metrics[f"{name}/{lang}/{metric}"] for lang in task_data.languages)
    model.train(was_training)
    return Evaluation(metrics, predictions)
