"""A resume of a finished monitored run logs no monitor row twice (issue 28): the trainer saves its last
checkpoint after the monitor's ``end`` (the final "forgetting" row and the probe's rows), so the resumed run keeps
those rows of metrics.jsonl and its monitor, restored from the checkpoint, must not log them again. Shown on the
monitor itself (ms), not on a training run: the trainer's part, metrics.jsonl cut to the checkpoint's rows, is
covered by tests/e2e/test_resume_safety.py."""

from __future__ import annotations

import json

from tests.helpers.forgetting import Log, lora_run


def kinds(log: Log) -> list[tuple[int, str]]:
    return [(step, kind) for step, kind, _ in log.events]


def with_probe(monitor) -> None:
    monitor.cfg = monitor.cfg.model_copy(update={"probe": monitor.cfg.probe.model_copy(update={"gammas": [0.5]})})


def test_resuming_a_finished_run_logs_no_final_row_or_probe_again(tmp_path):
    _, _, first = lora_run(tmp_path / "first")
    with_probe(first)
    log = Log()
    first.start(0, log)
    first.end(4)  # the last step was no measurement step: the final row, then the probe (θ_p and each adapter)
    assert [kind for _, kind in kinds(log)] == ["lambda_p", "forgetting", "probe", "probe", "probe"]
    saved = json.loads(json.dumps(first.state_dict()))  # as trainer_state.json keeps it

    _, _, resumed = lora_run(tmp_path / "resumed")  # the resumed process builds its monitor anew
    with_probe(resumed)
    resumed.load_state_dict(saved)
    again = Log()
    resumed.start(4, again)
    resumed.end(4)  # max_steps reached: no training step, then end() as in the first attempt
    assert kinds(again) == []
    assert resumed.state_dict() == saved  # and the run's new last checkpoint says the same


def test_a_run_resumed_before_its_end_still_ends_once(tmp_path):
    _, _, first = lora_run(tmp_path / "first")
    log = Log()
    first.start(0, log)
    first.evaluate(2)  # a measurement step, then a checkpoint at step 2
    saved = json.loads(json.dumps(first.state_dict()))
    _, _, resumed = lora_run(tmp_path / "resumed")
    resumed.load_state_dict(saved)
    again = Log()
    resumed.start(2, again)
    resumed.end(2)  # e.g. early stopping at the checkpoint's step: the step-2 row is in metrics.jsonl already
    resumed.end(4)  # ... or training went on to step 4: its final row is new
    assert kinds(again) == [(4, "forgetting")]
