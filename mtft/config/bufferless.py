"""The one rule of the bufferless step's second backward pass (``gradients.update: backward``).

That step forms each layer's part of the Gram at the layer's hook and writes the update by a second backward pass
over the first one's graph, keeping no tape. So it needs one micro-batch a step (the micro-batches' cross terms enter
the Gram), no descent check (which re-forms the products after the step), one process (the ranks' products must be
summed before the Gram) and no ZeRO-3 (which does not gather, for the second pass, the parameters it released after
the first). The config (:mod:`mtft.config.run_config`: the micro-batches and the descent check), the launch
(:func:`mtft.training.preflight.check_bufferless_update`: processes and ZeRO stage) and the store factory
(:func:`mtft.training.gradient_store.gradient_store`: all of them) each ask :func:`second_backward_refusal`, so the
rule and its messages stand here once.
"""

from __future__ import annotations

from typing import Optional

_TAPE = "gradients.update=tape"


def second_backward_refusal(
    micro_batches: int = 1, descent_check: bool = False, processes: int = 1, zero3: bool = False
) -> Optional[str]:
    """Why ``gradients.update: backward`` cannot run with ``micro_batches`` a step, the descent check,
    on ``processes`` processes, under ZeRO-3 (``zero3``), as one line for the user; None when it can."""
    if micro_batches > 1:
        return (
            "gradients.update=backward forms the Gram during the backward pass, exact for one "
            f"micro-batch a step (training.gradient_accumulation_steps={micro_batches}), since the micro-batches' "
            f"cross terms enter the Gram: use {_TAPE}"
        )
    if descent_check:
        return (
            "gradients.descent_check=true re-forms the per-objective products after the step, from the tape that "
            f"gradients.update=backward does not keep: use {_TAPE}"
        )
    if processes > 1:
        return (
            f"gradients.update=backward runs on one process ({processes} launched): the products of "
            f"several processes must be summed before they enter the Gram; use {_TAPE}"
        )
    if zero3:
        return (
            "gradients.update=backward runs a second backward pass over the first one's graph, and ZeRO-3 "
            f"does not gather the parameters it released after the first; use ZeRO stage 0-2 or {_TAPE}"
        )
    return None
