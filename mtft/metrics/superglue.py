"""SuperGLUE metrics that do not fit ``(predictions, references) -> float``: MultiRC, ReCoRD, CB.

Why by hand: ``evaluate.load("super_glue", ...)`` fetches its module from the Hub, which is not reachable. The
definitions follow the official SuperGLUE scorer (and ``evaluate``'s super_glue module):

* MultiRC: EM = fraction of *questions* whose every answer option is labelled correctly; F1a = binary F1 over all
  answer options pooled, positive class True.
* ReCoRD: max over the gold entities of SQuAD v1.1 EM and token F1 (normalisation from :mod:`.squad`), averaged
  over queries.
* CB: accuracy and macro-F1 over the classes.
"""

from __future__ import annotations

from typing import Hashable, Sequence

from sklearn.metrics import f1_score

from mtft.metrics.common import accuracy, macro_f1
from mtft.metrics.squad import squad_scores

_TRUE = {True, "true", "True", "1"}
_FALSE = {False, "false", "False", "0"}


def _as_bool(value: object, what: str, index: int) -> bool:
    # MultiRC's ClassLabel names are "False"/"True"; integer ids and bools are accepted too.
    try:
        if value in _TRUE:
            return True
        if value in _FALSE:
            return False
    except TypeError:  # unhashable
        pass
    raise ValueError(f"{what} {index}: {value!r} is not a MultiRC label (True/False, 1/0)")


def multirc_scores(
    predictions: Sequence[object], references: Sequence[object], question_ids: Sequence[Hashable]
) -> dict[str, float]:
    """``{"exact_match", "f1a"}`` for MultiRC answer options.

    ``question_ids`` gives each answer option's question; it must identify the question globally (in
    ``aps/super_glue`` the question index restarts per paragraph, so pass ``(paragraph, question)`` pairs).
    Options need not be contiguous per question.
    """
    if not len(predictions) == len(references) == len(question_ids):
        raise ValueError(
            f"{len(predictions)} predictions, {len(references)} references, {len(question_ids)} question ids"
        )
    if not predictions:
        raise ValueError("no predictions to score")
    pred = [_as_bool(p, "prediction", i) for i, p in enumerate(predictions)]
    gold = [_as_bool(r, "reference", i) for i, r in enumerate(references)]
    all_correct: dict[Hashable, bool] = {}
    for qid, p, g in zip(question_ids, pred, gold):
        all_correct[qid] = all_correct.get(qid, True) and p == g
    return {
        "exact_match": sum(all_correct.values()) / len(all_correct),
        "f1a": float(f1_score(gold, pred, pos_label=True, average="binary", zero_division=0)),
    }


def record_scores(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> dict[str, float]:
    """``{"exact_match", "f1"}`` for ReCoRD: per query the max over its gold entities (SQuAD v1.1 rules)."""
    return squad_scores(predictions, references)


def cb_scores(predictions: Sequence[Hashable], references: Sequence[Hashable]) -> dict[str, float]:
    """``{"accuracy", "macro_f1"}`` for CB (macro over the classes in references ∪ predictions, as sklearn)."""
    return {"accuracy": accuracy(predictions, references), "macro_f1": macro_f1(predictions, references)}
