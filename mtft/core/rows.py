"""Which objective and which task each row of the current batch belongs to.

The multi-task model declares it around each sub-call (the encoder, each head); layers deep inside the encoder
read it: Multi-LoRA routes every row to its task's B, and the per-objective gradient hooks attribute every
row's gradient to its objective. A context variable lets those layers keep the signature of ordinary modules,
so Hugging Face encoders run them unchanged.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar, Token
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


def declared_rows(kind: str) -> Optional[int]:
    """How many rows the enclosing ``labelled_rows`` declares a ``kind`` for (None: none declared)."""
    labels = _ROWS.get()
    value = getattr(labels, kind) if labels is not None else None
    return None if value is None else int(value.shape[0])


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
    return contextlib.nullcontext(), _Declared(_ROWS.get())


class _Declared:
    """Row labels declared for the duration of a recomputation. Reusable, unlike a generator's context manager: a
    layer is recomputed once per backward pass over its graph, and the bufferless step's second backward pass
    (``gradients.update: backward``) makes two."""

    def __init__(self, labels: Optional[RowLabels]):
        self.labels = labels
        self.tokens: list[Token] = []

    def __enter__(self) -> None:
        self.tokens.append(_ROWS.set(self.labels))

    def __exit__(self, *exc: object) -> None:
        _ROWS.reset(self.tokens.pop())
