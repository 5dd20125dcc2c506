"""``run.py study`` end to end on configs/studies/tiny.yaml (2 learning rates x 2 weightings x 2 seeds, 2 workers):
the runs, the aggregates against the runs' own metrics.json, a SIGKILLed study resumed to the same result, a
failing cell, submitit's executor, --report-only and bad input. A study the test signals itself is launched with
the warm Python's client as its interpreter (tests/helpers/warm_client.py), so that it and its runs start warm
as every other launch here does."""

from __future__ import annotations

import csv
import fcntl
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from mtft.core.runlock import lock_path
from tests.helpers.launch import MULTIPROCESS, REPO, THREADS, WARM, clean_env, kill_tree, launch_cli
from tests.helpers.study import study_failure

STUDY = "configs/studies/tiny.yaml"
CELLS = ["lr-0.001_method-mean", "lr-0.001_method-lfmlf", "lr-0.003_method-mean", "lr-0.003_method-lfmlf"]
pytestmark = pytest.mark.timeout(600)


# the shipped study, its runs shortened from 60 to 8 steps (what is tested here does not need them to learn), with
# a checkpoint and a forgetting measurement half-way, as the shipped study has
SHORTER = [
    "overrides.training.max_steps=8",
    "overrides.evaluation.every_steps=8",
    "overrides.checkpointing.every_steps=4",
    "overrides.forgetting.every_steps=4",
]


def study(out: Path, *args: str, timeout: float = 600, runs: bool = True) -> subprocess.CompletedProcess:
    """``run.py study`` on the shortened tiny study; one that ``runs`` (two at a time: the study's local workers, or
    one two-process job) waits for the other multi-process launches."""
    return launch_cli(
        "study", "--config", STUDY, f"output_dir={out}", *SHORTER, *args, timeout=timeout, processes=2 if runs else 1
    )


def run_metrics(out: Path, seeds: tuple[int, ...] = (0, 1)) -> dict[tuple[str, int], dict]:
    return {
        (cell, seed): json.loads((out / "runs" / cell / f"seed-{seed}" / "metrics.json").read_text())
        for cell in CELLS
        for seed in seeds
    }


#: run.py by its path, as a study the test signals itself is launched: the warm Python runs a script by its
#: absolute path (sys.argv[0] as well), a fresh interpreter as given; so both print the same command to continue
SCRIPT = str(REPO / "run.py")


def signalled_study(out: Path, *args: str, **streams) -> subprocess.Popen:
    """``python SCRIPT study`` on the shortened tiny study as a process the test signals itself. Its interpreter is
    the warm Python's client: the study and its runs are forked warm, and the client forwards the signals it gets
    to the study, ends as the study ended, and, SIGKILLed, takes the study with it (the warm Python SIGKILLs a run
    whose client is gone); ``sys.executable`` with ``MTFT_TESTS_COLD=1``."""
    python = sys.executable
    if WARM.folder is not None:
        if WARM.server is None or WARM.server.poll() is not None:
            WARM.start()  # the server writes the client
        python = WARM.paths()[1]
    command = [python, SCRIPT, "study", "--config", STUDY, f"output_dir={out}", *SHORTER, *args]
    env = clean_env(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS=str(THREADS))
    return subprocess.Popen(command, cwd=REPO, env=env, start_new_session=True, **streams)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("study") / "tiny"
    done = study(out)
    assert done.returncode == 0, study_failure(done, out)
    return out


def test_every_run_exists_as_an_ordinary_run(finished):
    for cell in CELLS:
        for seed in (0, 1):
            run = finished / "runs" / cell / f"seed-{seed}"
            config = (run / "config.yaml").read_text()
            assert f"seed: {seed}" in config and (run / "report.md").is_file()
    assert sorted(p.name for p in (finished / "runs").iterdir()) == sorted(CELLS)


def test_aggregates_equal_values_recomputed_from_the_runs(finished):
    results = json.loads((finished / "results.json").read_text())
    metrics = run_metrics(finished)
    assert [c["name"] for c in results["cells"]] == CELLS
    assert {"xnli/accuracy", "xnli/en/accuracy", "xnli/de/accuracy", "wall_s"} <= set(results["metrics"])
    assert any(m.startswith("F_p_final") for m in results["metrics"])
    for cell in results["cells"]:
        assert cell["complete"] == 2 and not cell["failed"] and not cell["pending"]
        values = np.array([metrics[(cell["name"], seed)]["xnli/accuracy"] for seed in (0, 1)])
        got = cell["metrics"]["xnli/accuracy"]
        assert got["mean"] == pytest.approx(values.mean()) and got["std"] == pytest.approx(values.std(ddof=1))
        assert got["min"] == values.min() and got["max"] == values.max()
        # failed runs: at or below the majority-class baseline each run reports beside its accuracy
        runs = [metrics[(cell["name"], seed)] for seed in (0, 1)]
        failed = [seed for seed, m in enumerate(runs) if m["xnli/accuracy"] <= m["xnli/majority_accuracy"]]
        rate = cell["failures"]["xnli/accuracy"]
        assert (rate["scored"], rate["failed"], rate["failed_seeds"]) == (2, len(failed), failed)
    # paired differences against the baseline (weighting mean at the same learning rate), paired t-test
    for diff in results["differences"]:
        if diff["metric"] != "xnli/accuracy":
            continue
        a = np.array([metrics[(diff["cell"], s)]["xnli/accuracy"] for s in (0, 1)])
        b = np.array([metrics[(diff["baseline_cell"], s)]["xnli/accuracy"] for s in (0, 1)])
        assert diff["baseline_cell"] == diff["cell"].replace("lfmlf", "mean")
        assert diff["mean"] == pytest.approx((a - b).mean())
        if np.std(a - b) > 0:
            assert diff["p_value"] == pytest.approx(stats.ttest_rel(a, b).pvalue)
    with (finished / "results.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert {row["cell"] for row in rows} == set(CELLS)
    text = (finished / "study.md").read_text()
    assert "paired t" in text and all(cell in text for cell in CELLS)
    assert "## Stability over seeds: failed fine-tuning runs" in text and rows[0]["at_or_below_majority"] != ""
    assert list((finished / "plots").glob("*.png"))


def test_report_only_reaggregates_without_running(finished):
    before = (finished / "results.json").read_text()
    (finished / "results.json").unlink()
    again = study(finished, "--report-only", runs=False)
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads((finished / "results.json").read_text()) == json.loads(before)
    assert "to run" not in again.stdout


def test_sigkilled_study_resumes_to_the_uninterrupted_result(finished, tmp_path):
    """The study of seed 0 alone (its 4 runs are the same runs as the seed-0 runs of ``finished``): SIGKILLed once a
    run has finished, then run again, it keeps the finished runs and ends every other where ``finished`` did."""
    out = tmp_path / "tiny"
    streams = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    with MULTIPROCESS.hold(), signalled_study(out, "seeds=[0]", **streams) as process:
        _kill_after_a_run_finished(process, out)
    finished_before = {p.parent: p.stat().st_mtime_ns for p in out.glob("runs/*/seed-*/metrics.json")}
    assert 0 < len(finished_before) < 4
    again = study(out, "seeds=[0]")
    assert again.returncode == 0, study_failure(again, out)
    assert f"{len(finished_before)} finished" in again.stdout
    for run_dir, mtime in finished_before.items():  # not re-run
        assert (run_dir / "metrics.json").stat().st_mtime_ns == mtime
    assert run_metrics(out, (0,)) == run_metrics(finished, (0,))  # resumed runs end where uninterrupted ones did
    # a run that finished just before the kill, its outcome unrecorded, gets its status from the run (issue 28)
    statuses = [json.loads(p.read_text()) for p in out.glob("status/*/seed-*.json")]
    assert len(statuses) == 4 and all(s["status"] == "finished" and s["wall_s"] > 0 for s in statuses), statuses
    assert "versions of the mtft source" not in (out / "study.md").read_text()


def _kill_after_a_run_finished(process: subprocess.Popen, out: Path) -> None:
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and not list(out.glob("runs/*/seed-*/metrics.json")):
            time.sleep(0.2)
        assert list(out.glob("runs/*/seed-*/metrics.json")), "no run finished in time"
        # the study alone (its client, which takes it along): its runs get SIGTERM from the kernel
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=60)
        _wait_for_the_runs_to_end(out, deadline=time.monotonic() + 60)
    finally:
        kill_tree(process.pid) if process.poll() is None else None


def _wait_for_the_runs_to_end(out: Path, deadline: float) -> None:
    """Until no run of the study holds its run directory's lock (mtft.core.runlock: the kernel releases it when the
    run's process is gone). The runs end after the study does -- the warm Python kills a run once its client is
    gone, a fresh interpreter's run gets SIGTERM -- and a run at its last step may write its metrics.json
    meanwhile: what counts as finished before the resume is read once none is left."""
    for lock in (lock_path(out / "runs" / cell / "seed-0") for cell in CELLS):
        if not lock.exists():  # the run never started
            continue
        with open(lock, "rb") as handle:
            while True:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    assert time.monotonic() < deadline, f"a run still holds {lock}"
                    time.sleep(0.1)
            fcntl.flock(handle, fcntl.LOCK_UN)


def test_a_failing_cell_is_reported_and_the_others_finish(tmp_path):
    out = tmp_path / "tiny"
    done = study(  # the second cell passes every check made before runs start, and fails once running
        out,
        "grid={pretrain.micro_batch_size: [16, 100000]}",
        "overrides.pretrain.before_finetune=true",
        "overrides.pretrain.tokens=2048",  # 4 steps of 16 x 32 tokens
        "seeds=[0]",
        "baseline=null",
    )
    assert done.returncode == 1
    results = json.loads((out / "results.json").read_text())
    ok, bad = results["cells"]
    assert ok["complete"] == 1 and bad["complete"] == 0 and len(bad["failed"]) == 1
    assert "fewer than one global batch" in bad["failed"][0]["error"]
    text = (out / "study.md").read_text()
    assert bad["failed"][0]["error"] in text
    assert "failed" in done.stdout


@pytest.mark.multiprocess
def test_submitit_executor_runs_a_two_process_job(tmp_path):
    out = tmp_path / "tiny"
    done = study(
        out,
        "executor.name=slurm",
        "executor.slurm.cluster=local",
        "executor.slurm.processes_per_node=2",
        "grid={weighting.method: [lfmlf]}",
        "seeds=[0]",
        "baseline=null",
    )
    assert done.returncode == 0, study_failure(done, out)
    log = (out / "logs" / "method-lfmlf" / "seed-0.log").read_text()
    assert "on 2 process(es)" in log
    assert (out / "runs" / "method-lfmlf" / "seed-0" / "metrics.json").is_file()
    assert json.loads((out / "results.json").read_text())["cells"][0]["complete"] == 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["overrides.training.optimizr.lr=1"], "[cell lr-0.001_method-mean]: unknown key 'training.optimizr'"),
        (["grid={training.optimizer.lr: [0.001, -1], weighting.method: [mean]}"], "[cell lr--1_method-mean]"),
        (["executor.name=kubernetes"], "executor.name"),
        (
            ["grid={data.tasks.0.languages: [[en], [xx]]}", "baseline=null"],
            "[cell languages-xx]: task 'xnli' has no language(s) xx",
        ),
    ],
)
def test_bad_input_one_line_nothing_written(tmp_path, args, message):
    out = tmp_path / "tiny"
    done = study(out, *args, runs=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_study_directory_of_another_study_is_refused(tmp_path):
    out = tmp_path / "tiny"
    first = study(out, "name=other", "--report-only", runs=False)
    assert first.returncode == 2 and "does not exist" in first.stderr
    (out).mkdir()
    (out / "mine.txt").write_text("keep")
    done = study(out, runs=False)
    assert done.returncode == 2 and "is not a study directory" in done.stderr
    assert (out / "mine.txt").read_text() == "keep"


LONGER = ["overrides.training.max_steps=40", "overrides.evaluation.every_steps=40", "seeds=[0]"]


def test_ctrl_c_stops_cleanly_and_says_how_to_continue(tmp_path):
    out = tmp_path / "tiny"
    with MULTIPROCESS.hold():
        # runs of 40 steps: SIGINT at the first checkpoint (step 4) lands with most of a run left (at 8 steps the two
        # running runs could finish before the signal reached them: no run left to interrupt)
        process = signalled_study(out, *LONGER, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 400
            while time.monotonic() < deadline and not list(out.glob("runs/*/seed-0/checkpoints/step-*")):
                time.sleep(0.2)
            process.send_signal(signal.SIGINT)
            _, stderr = process.communicate(timeout=300)
        finally:
            kill_tree(process.pid) if process.poll() is None else None
    assert process.returncode == 130, stderr[-2000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("error: study stopped by SIGINT") and "--resume" not in last
    given = " ".join(shlex.quote(arg) for arg in [*SHORTER, *LONGER])
    script = shlex.quote(SCRIPT)
    continued = f"cd {shlex.quote(str(REPO))} && python {script} study --config {STUDY} output_dir={out} {given}"
    assert last.endswith(f"continue with: {continued}")  # from any folder (a relative run.py: tests/unit/study)
    statuses = [json.loads(p.read_text())["status"] for p in out.glob("status/*/seed-0.json")]
    assert "interrupted" in statuses and "failed" not in statuses
    assert len(list(out.glob("runs/*/seed-0/metrics.json"))) < 4  # it stopped: not every run finished
