"""Run logs: a JSON-lines metrics file, optional TensorBoard scalars, and the text log."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import sys
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

from mtft.core.atomic import write_text

logger = logging.getLogger("mtft")


class ConsoleHandler(logging.StreamHandler):
    """The console's log lines, written through ``tqdm.write``: a line printed while a progress bar is drawn (the
    run's, pre-training's, predict's) clears the bar, takes a line of its own and the bar is drawn again below it,
    instead of the two breaking into each other ("[\nmtft] ..."). They go to ``sys.stderr`` as it is when each line
    is written, as logging's own last-resort handler does: a run started from Python after the caller redirected
    ``sys.stderr`` (a notebook cell, ``contextlib.redirect_stderr``) writes where the caller sees it, not into the
    stream that was current when the first run attached the handler. A handler given a ``stream`` writes there."""

    def __init__(self, stream=None) -> None:  # noqa: ANN001 -- a text stream; None: sys.stderr at each line
        logging.Handler.__init__(self)
        self._fixed = stream

    @property
    def stream(self):  # noqa: ANN201 -- a text stream
        return self._fixed if self._fixed is not None else sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # noqa: ANN001 -- logging.StreamHandler.setStream assigns it
        pass

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # noqa: BLE001 -- logging's own convention: a handler never raises
            self.handleError(record)


def setup_console_logging(is_main: bool) -> None:
    if not logger.handlers:
        handler = ConsoleHandler()
        handler.setFormatter(logging.Formatter("[mtft] %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO if is_main else logging.WARNING)
    logger.propagate = False


class _Held(logging.Handler):
    """Log records kept in memory until :func:`add_file_log` writes them (see :func:`held_log_lines`)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def held_log_lines() -> Iterator[None]:
    """Keep the log's lines in memory for the ``with`` block (a run, start to end): :func:`add_file_log` writes them
    to ``train.log`` first, with their own times, and a run refused before it attaches the file (a resume whose
    checkpoints all fail to load) leaves ``train.log`` untouched; whatever was never written is dropped at the end
    of the block, and the run's ``train.log`` is closed there, so that a second run in the same Python (a notebook,
    a sweep driven from a script) does not write its lines into the first run's log."""
    before = set(logger.handlers)  # a block inside another (a backbone pre-trained for a run) ends only its own
    held = _Held()
    logger.addHandler(held)
    try:
        yield
    finally:
        for handler in [h for h in logger.handlers if h not in before and isinstance(h, (_Held, _RunFile))]:
            logger.removeHandler(handler)
            handler.close()


class _RunFile(logging.FileHandler):
    """A run's ``train.log``, closed when the run ends (:func:`held_log_lines`)."""


def add_file_log(run_dir: Path) -> None:
    """Log to ``run_dir/train.log`` (appending) from now on, after the lines held so far."""
    handler = _RunFile(run_dir / "train.log", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    for held in [h for h in logger.handlers if isinstance(h, _Held)]:
        logger.removeHandler(held)
        for record in held.records:
            handler.handle(record)
    logger.addHandler(handler)


class MetricsLog:
    """``metrics.jsonl``: one object per event, ``{"step", "kind", ...values}``; mirrored to TensorBoard."""

    def __init__(
        self,
        run_dir: Path,
        enabled: bool,
        report_to: Sequence[str] = (),
        resume_step: Optional[int] = None,
        resume_rows: Optional[int] = None,
        name: str = "run",
        params: Optional[dict[str, Any]] = None,
    ):
        """``report_to``: the trackers every row also goes to (:mod:`mtft.reporting.trackers`), the run known to
        them by ``name`` with its config ``params``."""
        self.path = run_dir / "metrics.jsonl"
        self.enabled = enabled
        self.trackers: list[Any] = []
        self.rows = 0  # rows in metrics.jsonl; a checkpoint records it (trainer state "log_rows")
        if not enabled:
            return
        if resume_step is not None and self.path.exists():
            self.rows = self._truncate(resume_step, resume_rows)
        if report_to:
            from mtft.reporting.trackers import build_trackers, flat

            self.trackers = build_trackers(list(report_to), run_dir, name, flat(params or {}), resume_step)

    def _truncate(self, resume_step: int, resume_rows: Optional[int]) -> int:
        """Keep what was logged up to the checkpoint we resume from: its first ``resume_rows`` rows (the count the
        checkpoint recorded), or for a checkpoint without that count the rows up to ``resume_step``. A torn last
        line (a power cut or a full disk while appending) is dropped with a warning; a row the interrupted attempt
        logged after the checkpoint would otherwise appear twice. Rewritten in one rename."""
        rows, torn = [], 0
        for line in self.path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                row = json.loads(line)
                int(row["step"])
            except (ValueError, TypeError, KeyError):
                torn += 1
                continue
            rows.append(line)
        if torn:
            logger.warning(f"{self.path}: dropped {torn} unreadable line(s) (a torn write)")
        if resume_rows is not None and resume_rows <= len(rows):
            kept = rows[:resume_rows]
        else:
            kept = [line for line in rows if json.loads(line)["step"] <= resume_step]
        write_text(self.path, "".join(line + "\n" for line in kept))
        return len(kept)

    def log(self, step: int, kind: str, values: dict[str, Any]) -> None:
        if not self.enabled:
            return
        clean = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in values.items()}
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps({"step": step, "kind": kind, **clean}) + "\n")
        self.rows += 1
        if self.trackers:
            scalars = {
                f"{kind}/{key}": float(value)
                for key, value in clean.items()
                if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            }
            for tracker in self.trackers:
                tracker.log(step, scalars)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()
        self.trackers = []


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
