"""Loading a checkpoint through transformers' Auto classes, and telling the user in one line what differs.

transformers (5.x) logs a "LOAD REPORT" table through its ``transformers.modeling_utils`` logger whenever the keys
of a checkpoint and of the model class differ: an encoder class loaded from a masked-LM checkpoint lists the MLM
head as UNEXPECTED and the pooler as MISSING. Both are expected here -- mtft drops the pooler (its heads pool for
themselves) and the encoder has no use for an MLM head -- while a missing *encoder* weight would silently start
from random numbers. mtft therefore asks for the same facts (``from_pretrained(..., output_loading_info=True)``),
keeps that logger and the loading progress bar quiet for the call, and logs one line of its own; weights the run
needs that the checkpoint lacks, or holds in another shape, are a warning.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Iterable, Iterator

from transformers.utils import logging as hf_logging

from mtft.reporting.logs import logger

SHOWN = 5  # key names a warning lists before "..."


@dataclass
class LoadInfo:
    """Parameter names the checkpoint lacked (initialised by transformers), held but the model has no use for, or
    held in another shape (re-initialised)."""

    missing: set[str] = field(default_factory=set)
    unexpected: set[str] = field(default_factory=set)
    mismatched: set[str] = field(default_factory=set)


def load_pretrained(auto_class, name: str, **kwargs):
    """``auto_class.from_pretrained(name, **kwargs)`` without transformers' load report: (model, :class:`LoadInfo`)."""
    with quiet_transformers():
        model, info = auto_class.from_pretrained(name, output_loading_info=True, **kwargs)
    mismatched = {key[0] if isinstance(key, (tuple, list)) else key for key in info.get("mismatched_keys", ())}
    return model, LoadInfo(set(info.get("missing_keys", ())), set(info.get("unexpected_keys", ())), mismatched)


def _errors_only(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.ERROR


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """For the block: transformers' model-loading logger passes errors only (through a filter: raising its level
    would turn on other checks that log), and its progress bars are off."""
    log = hf_logging.get_logger("transformers.modeling_utils")
    bar = hf_logging.is_progress_bar_enabled()
    log.addFilter(_errors_only)
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        log.removeFilter(_errors_only)
        if bar:
            hf_logging.enable_progress_bar()


def modules(keys: Iterable[str], prefix: str = "") -> list[str]:
    """Top-level modules of parameter names as ``name.*`` (``pooler.dense.weight`` -> ``pooler.*``); a leading
    base-model ``prefix`` (``bert.``, ``roberta.``) is kept with the module below it."""
    out = set()
    for key in keys:
        parts = key.split(".")
        depth = 2 if prefix and parts[0] == prefix and len(parts) > 2 else 1
        out.add(".".join(parts[:depth]) + ".*")
    return sorted(out)


def listing(keys: Iterable[str]) -> str:
    keys = sorted(keys)
    return ", ".join(keys[:SHOWN]) + (f", ... ({len(keys)} in all)" if len(keys) > SHOWN else "")


def report_encoder_load(name: str, info: LoadInfo) -> None:
    """What loading the encoder ``name`` means for the run: the pooler is dropped either way, other heads of the
    checkpoint are not part of the encoder; an encoder weight the checkpoint lacks starts at random (warning)."""
    pooler = {k for k in info.missing if k.split(".")[0] == "pooler"}
    missing = (info.missing - pooler) | info.mismatched
    notes = []
    if pooler:
        notes.append("pooler not in the checkpoint: unused (the task heads pool for themselves)")
    if info.unexpected:
        notes.append(f"{', '.join(modules(info.unexpected))} of the checkpoint ignored (not part of the encoder)")
    if notes:
        logger.info(f"model.backbone={name}: " + "; ".join(notes))
    if missing:
        logger.warning(
            f"model.backbone={name}: {len(missing)} encoder weight(s) not in the checkpoint (or of another shape), "
            f"initialised at random: {listing(missing)}"
        )
