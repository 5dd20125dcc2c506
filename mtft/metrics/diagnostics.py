"""SuperGLUE AX-g's gender parity, computed offline.

AX-g (Winogender schemas recast as entailment) comes in minimal pairs that differ only in the gender of a
pronoun; gender parity is the fraction of pairs whose two predictions agree (Rudinger et al., 2018; SuperGLUE
reports it beside accuracy). ``aps/super_glue`` does not carry the original ``pair_id``: the two members of a
pair are the consecutive indices ``2k`` and ``2k + 1``, the convention of lm-evaluation-harness's ``parity``.
"""

from __future__ import annotations

from typing import Hashable, Sequence


def gender_parity(predictions: Sequence[Hashable], indices: Sequence[int]) -> float:
    """Fraction of the complete pairs (indices 2k and 2k+1 both present) with equal predictions.

    An example whose partner is absent (an evaluation cut to an odd number of rows) takes part in no pair;
    raises ``ValueError`` when no pair is complete or an index repeats.
    """
    if len(predictions) != len(indices):
        raise ValueError(f"{len(predictions)} predictions for {len(indices)} indices")
    by_index: dict[int, Hashable] = {}
    for index, prediction in zip(indices, predictions):
        if index in by_index:
            raise ValueError(f"AX-g index {index} appears twice")
        by_index[int(index)] = prediction
    agreements = [by_index[i] == by_index[i + 1] for i in sorted(by_index) if i % 2 == 0 and i + 1 in by_index]
    if not agreements:
        raise ValueError("no complete AX-g pair (indices 2k and 2k+1) to compute gender parity on")
    return sum(agreements) / len(agreements)
