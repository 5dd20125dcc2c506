"""Which objective and which task each row of the current batch belongs to.

The multi-task model declares it around each sub-call (the encoder, each head); layers deep inside the encoder
read it: Multi-LoRA routes every row to its task's B, and the per-objective gradient hooks attribute every
row's gradient to its objective. A context variable lets those layers keep the signature of ordinary modules,
so Hugging Face encoders run them unchanged.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Iterator, Optional

import torch


@dataclass(frozen=True)
class RowLabels:
    objective: Optional[torch.Tensor] = None
    task: Optional[torch.Tensor] = None


_ROWS: ContextVar[Optional[RowLabels]] = ContextVar("mtft_row_labels", default=None)


@contextlib.contextmanager
def labelled_rows(*, objective: Optional[torch.Tensor] = None, task: Optional[torch.Tensor] = None) -> Iterator[None]:
    """Declare the objective and/or task of each row (first dimension) for the modules called in the block."""
    token = _ROWS.set(RowLabels(objective, task))
    try:
        yield
    finally:
        _ROWS.reset(token)


def row_labels(kind: str, caller: str, rows: int) -> torch.Tensor:
    """The declared ``kind`` ("objective" or "task") of each of ``rows`` rows; a clear error when undeclared."""
    labels = _ROWS.get()
    value = getattr(labels, kind) if labels is not None else None
    if value is None:
        raise RuntimeError(f"{caller} ran outside labelled_rows({kind}=...): the {kind} of each row is unknown")
    if value.shape[0] != rows:
        raise RuntimeError(f"labelled_rows declares {value.shape[0]} rows, {caller} got {rows}")
    return value


def rows_for_recomputation() -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
    """A ``context_fn`` for ``torch.utils.checkpoint``: the row labels declared when a layer first runs, declared
    again when activation checkpointing recomputes it in the backward pass (outside the model's own declaration), so
    that a layer that reads them (Multi-LoRA's routing) recomputes what it first computed."""
    labels = _ROWS.get()

    @contextlib.contextmanager
    def declared() -> Iterator[None]:
        token = _ROWS.set(labels)
        try:
            yield
        finally:
            _ROWS.reset(token)

    return contextlib.nullcontext(), declared()
