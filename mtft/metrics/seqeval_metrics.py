"""Entity-level micro precision/recall/F1 for NER (WikiANN / PAN-X), computed offline with ``seqeval``.

Why here: ``evaluate.load("seqeval")`` fetches its module from the Hub, which is not reachable; the
``seqeval`` package it wraps is installed, so we call it directly.

Tags are word-level IOB2 strings (``O``, ``B-PER``, ``I-PER``...), one per word: the first sub-token of each word
carries the word's prediction (the XTREME convention for PAN-X; Hu et al., 2020).

Modes:

* ``"default"`` (what the product uses): seqeval's default, CoNLL-eval-compatible chunking. An ``I-X`` that
  does not follow ``B-X``/``I-X`` starts a new entity. This is the XTREME / PAN-X convention and what
  ``evaluate``'s seqeval module reports by default.
* ``"strict"``: seqeval strict mode with the IOB2 scheme; an ``I-X`` without a preceding ``B-X`` is not an
  entity at all, so ill-formed predictions score lower.

The two modes give different numbers on ill-formed tag sequences; use one mode consistently for every run and
language that are compared (results reported here use ``"default"``).
"""

from __future__ import annotations

from typing import Literal, Sequence

from seqeval.metrics import f1_score, precision_score, recall_score
from seqeval.scheme import IOB2

Mode = Literal["default", "strict"]
DEFAULT_MODE: Mode = "default"


def entity_f1(
    predicted_tags: Sequence[Sequence[str]],
    gold_tags: Sequence[Sequence[str]],
    mode: Mode = DEFAULT_MODE,
) -> dict[str, float]:
    """Entity-level micro ``{"precision", "recall", "f1"}`` in [0, 1] over all sentences.

    Raises ``ValueError`` when the numbers of sentences differ or a sentence's predicted and gold tag lists have
    different lengths (the message names the sentence index). Scores with no entity to divide by are 0.
    """
    if len(predicted_tags) != len(gold_tags):
        raise ValueError(f"{len(predicted_tags)} predicted sentences for {len(gold_tags)} gold sentences")
    for i, (pred, gold) in enumerate(zip(predicted_tags, gold_tags)):
        if len(pred) != len(gold):
            raise ValueError(f"sentence {i}: {len(pred)} predicted tags for {len(gold)} gold tags")
    if mode == "default":
        options: dict = {}
    elif mode == "strict":
        options = {"mode": "strict", "scheme": IOB2}
    else:
        raise ValueError(f"unknown mode {mode!r}; expected 'default' or 'strict'")
    y_true = [list(s) for s in gold_tags]
    y_pred = [list(s) for s in predicted_tags]
    return {
        name: float(fn(y_true, y_pred, average="micro", zero_division=0, **options))
        for name, fn in (("precision", precision_score), ("recall", recall_score), ("f1", f1_score))
    }
