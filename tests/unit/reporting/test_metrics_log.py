"""metrics.jsonl on resume: a torn last line is dropped, rows after the checkpoint are not kept twice."""

from __future__ import annotations

import json
import logging

from mtft.reporting.logs import MetricsLog, read_metrics


def _rows(run_dir, steps):
    log = MetricsLog(run_dir, True)
    for step in steps:
        log.log(step, "train", {"loss": 1.0})
    return log


def test_rows_are_counted_and_resume_keeps_the_checkpoints_rows(tmp_path):
    assert _rows(tmp_path, [1, 2, 2, 3]).rows == 4
    log = MetricsLog(tmp_path, True, (), resume_step=2, resume_rows=2)
    assert log.rows == 2 and [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
    log.log(3, "train", {})
    assert log.rows == 3


def test_without_a_row_count_rows_past_the_step_are_dropped(tmp_path):
    _rows(tmp_path, [1, 2, 3, 4])
    assert MetricsLog(tmp_path, True, (), resume_step=2).rows == 2
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]


def test_a_torn_last_line_is_dropped_with_a_warning(tmp_path, caplog):
    _rows(tmp_path, [1, 2])
    with (tmp_path / "metrics.jsonl").open("a") as handle:
        handle.write('{"step": 3, "ki')
    logger = logging.getLogger("mtft")
    logger.addHandler(caplog.handler)
    try:
        log = MetricsLog(tmp_path, True, (), resume_step=3, resume_rows=None)
    finally:
        logger.removeHandler(caplog.handler)
    assert log.rows == 2 and [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [
        1,
        2,
    ]
    # the handler is added because the "mtft" logger may not propagate (run.py's console set-up turns it off)
    assert f"{tmp_path / 'metrics.jsonl'}: dropped 1 unreadable line(s) (a torn write)" in caplog.messages


def _file_handlers(logger):
    return [h for h in logger.handlers if isinstance(h, logging.FileHandler)]


def test_log_lines_are_held_until_the_run_is_accepted(tmp_path):
    """train.log gets the lines logged before it was attached, in order; a run refused before that writes none; the
    file is closed when the run's block ends."""
    from mtft.reporting.logs import add_file_log, held_log_lines

    logger = logging.getLogger("mtft")
    level, attached = logger.level, _file_handlers(logger)
    logger.setLevel(logging.INFO)
    try:
        try:
            with held_log_lines():
                logger.info("loaded the data")
                raise RuntimeError("no checkpoint loads")  # refused before add_file_log
        except RuntimeError:
            pass
        assert _file_handlers(logger) == attached and list(tmp_path.iterdir()) == []
        with held_log_lines():
            logger.info("loaded the data again")
            logger.warning("checkpoint step-4 is damaged")
            add_file_log(tmp_path)
            logger.info("resumed")
        logger.info("after the block")  # the run has ended: its train.log is closed, a later run's lines stay out
        lines = (tmp_path / "train.log").read_text().splitlines()
        assert [line.split(" ", 2)[2] for line in lines] == [
            "INFO loaded the data again",  # nothing of the refused attempt: its held lines were dropped
            "WARNING checkpoint step-4 is damaged",
            "INFO resumed",
        ]
        assert _file_handlers(logger) == attached
    finally:
        for handler in _file_handlers(logger):
            if handler not in attached:
                logger.removeHandler(handler)
                handler.close()
        logger.setLevel(level)


def test_a_log_line_during_a_progress_bar_takes_a_line_of_its_own():
    """The console's lines go through tqdm.write: printed while the bar is drawn, a line clears the bar, stands on
    its own line whole, and the bar is drawn again after it (no "[\\nmtft] ..." or "rror: ..." fragments)."""
    import io
    import logging

    from tqdm import tqdm

    from mtft.reporting.logs import ConsoleHandler

    stream = io.StringIO()
    handler = ConsoleHandler(stream)
    handler.setFormatter(logging.Formatter("[mtft] %(message)s"))
    record = logging.LogRecord("mtft", logging.INFO, __file__, 1, "step 2: loss 0.5", None, None)
    with tqdm(total=4, file=stream, desc="train", mininterval=0, ascii=True) as bar:
        bar.update(1)
        handler.emit(record)
        bar.update(1)
    lines = [line.split("\r")[-1] for line in stream.getvalue().split("\n")]
    assert "[mtft] step 2: loss 0.5" in lines


def test_a_tracker_whose_library_is_missing_is_one_line(monkeypatch):
    import importlib.util

    import pytest

    from mtft.core.errors import ConfigError
    from mtft.reporting.trackers import check_trackers

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match="logging.report_to: wandb needs the wandb package: pip install wandb"):
        check_trackers(["tensorboard", "wandb"])


def test_mlflow_names_keep_a_metric_and_its_objectives_apart():
    """train/loss and train/loss/xnli/en cannot both be files of MLflow's file store: the key's own path goes dotted."""
    from mtft.reporting.trackers import MLflow

    assert MLflow.name("train/loss/xnli/en") == "train/loss.xnli.en" and MLflow.name("train/loss") == "train/loss"
