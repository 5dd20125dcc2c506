"""The launchers a user copies from README.md "Launchers": the DeepSpeed launcher with a loopback hostfile (the
flags a machine without an ssh server needs), and what a multi-process launch prints for a user error -- its one
line once, not once per process."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.launch import free_port, run_launcher, run_torchrun
from tests.helpers.runs import BASE_CONFIG, base_overrides, read_jsonl

pytestmark = pytest.mark.multiprocess


@pytest.mark.timeout(300)
def test_deepspeed_launcher_with_a_loopback_hostfile(tmp_path):
    """README's CPU command: `deepspeed --hostfile hostfile --no_ssh_check --master_addr 127.0.0.1 run.py ...` with
    `localhost slots=2` starts two processes (the slots, not a --num_gpus count) that train together."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    out = tmp_path / "run"
    flags = ["--hostfile", str(hostfile), "--no_ssh_check", "--master_addr", "127.0.0.1"]
    extra = {"evaluation.every_steps": None, "checkpointing.every_steps": None, "weighting.method": "mean"}
    command = [*flags, "--master_port", str(free_port()), "run.py", "--config", BASE_CONFIG]
    # the `deepspeed` command's own entry point; it starts DeepSpeed's launch module, which starts the ranks
    result = run_launcher("deepspeed.launcher.runner", *command, *base_overrides(out, 2, **extra), timeout=280)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "on 2 process(es)" in result.stdout + result.stderr
    assert [row["step"] for row in read_jsonl(out / "metrics.jsonl") if row["kind"] == "train"] == [2]
    assert (Path(out) / "report.md").read_text().count("| processes | 2 |") == 1


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "override, message",
    [
        ("training.max_steps=-3", "training.max_steps: Input should be greater than or equal to 1"),  # the schema
        ("data.tasks.0.languages=[en,xx]", "no language(s) xx"),  # preflight: the task's languages
    ],
)
def test_two_processes_print_a_user_error_once(tmp_path, override, message):
    """Every rank refuses the input alike; the node's first process prints the one line (torchrun's own report of
    the failed processes follows it -- torchrun's, not mtft's), the exit status is not 0, nothing is written."""
    out = tmp_path / "run"
    result = run_torchrun("--config", BASE_CONFIG, f"run.output_dir={out}", override, timeout=200)
    assert result.returncode != 0
    assert result.stderr.count("error:") == 1 and message in result.stderr, result.stderr
    assert result.stderr.lstrip().startswith("error: ") and "error:" not in result.stdout
    assert not out.exists()
