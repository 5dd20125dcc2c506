"""Ctrl-C outside the training loop (loading data or the model, a conversion, a command) is one line and exit 130,
never a KeyboardInterrupt traceback (the loop itself saves a checkpoint first: tests/e2e/test_resume_safety.py)."""

from __future__ import annotations

import pytest

from mtft import cli


def test_ctrl_c_before_training_is_one_line(monkeypatch, capsys):
    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "main", interrupted)
    with pytest.raises(SystemExit) as stop:
        cli.entry_point(["--config", "x.yaml"])
    assert stop.value.code == 130
    err = capsys.readouterr().err
    assert err.startswith("error: stopped by Ctrl-C") and err.count("\n") == 1 and "Traceback" not in err
