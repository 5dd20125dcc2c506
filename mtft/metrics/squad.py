"""The official SQuAD v1.1 evaluation (``evaluate-v1.1.py``), re-implemented offline.

Why by hand: ``evaluate.load("squad")`` fetches its module from the Hub, which is not reachable. The rules below
are exactly those of the official v1.1 script: lower-case, drop ASCII punctuation (``string.punctuation``), drop
the English articles a/an/the as whole words, collapse whitespace; token F1 on whitespace tokens; per question
the max over gold answers; the mean over questions. Unlike the official script (percentages), scores are
fractions in [0, 1].

MLQA / TyDiQA language-specific normalisation (Unicode punctuation, per-language articles, mixed segmentation)
is NOT applied: as XTREME reports TyDiQA-GoldP, the plain SQuAD v1.1 rules are used for every language.

One quirk of v1.1 is kept on purpose: a prediction and a gold that both normalise to the empty string (e.g.
"The" vs "a") give EM 1 but F1 0.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Sequence

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """Lower-case, remove punctuation, articles and extra whitespace (official v1.1 order)."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when the normalised strings are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction: str, gold: str) -> float:
    """Token-level F1 of the normalised answers (bag of tokens, official v1.1)."""
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    common = Counter(pred_tokens) & Counter(gold_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_scores(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> dict[str, float]:
    """``{"exact_match", "f1"}``: mean over questions of the max over that question's gold answers."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} questions")
    if not predictions:
        raise ValueError("no predictions to score")
    em_total = f1_total = 0.0
    for i, (prediction, golds) in enumerate(zip(predictions, references)):
        if isinstance(golds, str) or len(golds) == 0:
            raise ValueError(f"question {i}: references must be a non-empty list of gold answers")
        em_total += max(exact_match(prediction, gold) for gold in golds)
        f1_total += max(f1(prediction, gold) for gold in golds)
    return {"exact_match": em_total / len(predictions), "f1": f1_total / len(predictions)}
