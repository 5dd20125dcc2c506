"""The majority-class baseline: what each task's official metrics give the constant prediction of the majority class
of its training labels, scored on the same split as the model and by the same code (:func:`score`), so that CoLA's
MCC gives 0 and MRPC's F1 whatever the constant "equivalent" or "not_equivalent" earns.

A fine-tuning run whose score is at or below this baseline is a *failed run* (Mosbach, Andriushchenko & Klakow,
2021, "On the stability of fine-tuning BERT"): the study counts them (``failure:`` in the study file). Names:
``<task>/<language>/majority_<metric>`` and the macro average over languages ``<task>/majority_<metric>``, beside
the model's ``<task>/<language>/<metric>`` and ``<task>/<metric>``. Task kinds without a class predicted for every
example (regression, token classification, extractive QA, ReCoRD's candidates) get none; nor does a task whose
training labels ``run.py evaluate`` cannot read (evaluation-only data: :func:`mtft.data.pipeline.prepare_data`
with ``trained`` says so in the log), since nothing else tells which class the run saw most.
"""

from __future__ import annotations

from mtft.data.pipeline import DEV, PreparedData
from mtft.evaluation.evaluate import add_macro_averages
from mtft.evaluation.scoring import score
from mtft.tasks.hidden import HiddenLabelsError

MAJORITY = "majority_"  # the prefix of the baseline's metric names


def majority_baselines(data: PreparedData, dev: bool = False) -> dict[str, float]:
    """The baseline's metrics on what :func:`~mtft.evaluation.evaluate.evaluate` scores with the same ``dev``.

    The majority class is counted over the training labels of the task whose head predicts (an evaluation-only
    task such as GLUE AX borrows its owner's head, and so its owner's training labels), all training languages
    pooled, after ``data.dev_split`` held its examples out. Labels only: no model, no forward pass."""
    metrics: dict[str, float] = {}
    for objective in data.eval_objectives(dev):
        td = data.tasks[objective.task]
        owner = data.tasks[data.head_of(objective.task)]
        where_train = ", ".join(owner.origin["train", lang] for lang in owner.raw_train) or objective.task
        prediction = owner.task.majority_prediction(
            [owner.trained_raw(lang) for lang in owner.raw_train], owner.label_names, where_train
        )
        if prediction is None:
            continue
        raw = td.raw_dev[objective.language] if dev else td.raw_eval[objective.language]
        where = td.origin[DEV if dev else td.eval_split, objective.language]
        try:
            references = td.task.references(raw, td.label_names, where)
        except HiddenLabelsError:  # a benchmark test set: nothing to score against
            continue
        constant = dict.fromkeys(references, prediction)
        for name, value in score(td.task, constant, references, td.label_names, where).items():
            metrics[f"{objective.key}/{MAJORITY}{name}"] = value
    add_macro_averages(metrics, data, dev, MAJORITY)
    return metrics
