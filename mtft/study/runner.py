"""``run.py study``: plan every run, validate it, run what is not finished, aggregate what is.

The order is the promise: the whole study is resolved and validated before the first run starts; the study directory
is claimed (refused when it holds another study, or a run whose config changed); finished runs are skipped,
interrupted ones resume, failed ones are retried and, if they fail again, listed with their error line; then the
tables, paired differences and plots are written from the run directories on disk.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sys
from pathlib import Path
from typing import Any, Iterator

from mtft.core.errors import DiskFullError
from mtft.core.runlock import run_lock
from mtft.study import loo
from mtft.study.aggregate import aggregate
from mtft.study.analyses import build_analyses, write_analyses
from mtft.study.collect import collect
from mtft.study.jobs import RunJob
from mtft.study.local import default_threads, run_local
from mtft.study.plan import PlannedRun, expand_cells, plan_runs
from mtft.study.report import write_results
from mtft.study.slurm import check_slurm, run_slurm
from mtft.study.spec import StudySpec
from mtft.study.state import (
    check_no_links,
    check_run_configs,
    check_study_dir,
    is_finished,
    log_path,
    open_study_dir,
    record_attempt,
    recover_status,
    status_path,
    write_run_configs,
)

logger = logging.getLogger("mtft")


def run_study(spec: StudySpec, base: Path, study_file: Path, report_only: bool = False) -> dict[str, Any]:
    runs = plan_runs(spec, base, study_file)  # every cell validated before anything is written
    build_analyses(spec.analyses, spec.axes)  # so is every analysis the study asks for
    root = spec.directory
    check_study_dir(root, spec.name, existing=report_only)
    if spec.executor.name == "slurm" and not report_only:
        check_slurm(spec.executor.slurm)
    with run_lock(root), _disk_full_in_one_line(root):  # one study process at a time in the folder
        check_no_links(root)  # nothing written through a link planted in the folder, report included
        if not report_only:
            check_study_dir(root, spec.name)  # again, now that no other study process can be claiming it
            check_run_configs(runs)  # refused before anything is written: a refused command changes nothing
            open_study_dir(root, spec.name, study_file.read_text(encoding="utf-8"))
            write_run_configs(runs)
            for run in runs:  # a study killed after a run finished and before it recorded it
                recover_status(status_path(root, run), run.run_dir)
            todo = [run for run in runs if not is_finished(run.run_dir)]
            pairs = f" (+ {spec.leave_one_out.draws} leave-one-out run(s) each)" if spec.leave_one_out else ""
            seeds = f"{len(spec.seed_list)} seeds" + (
                " (fewer for some cells: fewer_seeds)" if spec.fewer_seeds else ""
            )
            print(
                f"[mtft] study {spec.name}: {len(expand_cells(spec))} cells x {seeds}{pairs} = "
                f"{len(runs)} runs, {len(runs) - len(todo)} finished, {len(todo)} to run -> {root}",
                flush=True,
            )
            if todo:
                execute(spec, root, todo)
        return report(spec, root, runs, study_file)


@contextlib.contextmanager
def _disk_full_in_one_line(root: Path) -> Iterator[None]:
    """A write that ran out of space, wherever in the study, is one line whose advice ``run.py study`` accepts: the
    same command continues (finished runs kept, interrupted ones resumed); it has no ``--resume``."""
    try:
        yield
    except (DiskFullError, OSError) as error:
        if isinstance(error, DiskFullError):
            where = str(error).partition(";")[0]  # "no space left on <path>"
        elif error.errno in (errno.ENOSPC, errno.EDQUOT):
            where = f"no space left on {error.filename or root}"
        else:
            raise
        raise DiskFullError(
            f"{where}; free some space, then run the same study command again (finished runs are kept)"
        ) from None


def execute(spec: StudySpec, root: Path, todo: list[PlannedRun]) -> None:
    executor = spec.executor
    jobs = [make_job(root, run, spec) for run in todo]

    def on_result(result: dict[str, Any]) -> None:
        if result["status"] == "failed":
            print(f"[mtft] {result['key']} failed: {result['error']}", flush=True)
            run = next(r for r in todo if r.key == result["key"])
            if result.get("returncode") is None:  # died outside the run: the job recorded nothing
                record_attempt(status_path(root, run), "failed", None, 0.0, result["error"])

    if executor.name == "local":
        for job in jobs:
            job.threads = executor.threads or default_threads(executor.workers)
        run_local(jobs, executor.workers, on_result)
    else:
        run_slurm(jobs, executor.slurm, root / "slurm", on_result)


def make_job(root: Path, run: PlannedRun, spec: StudySpec) -> RunJob:
    return RunJob(
        key=run.key,
        config_path=str(run.config_path.absolute()),
        run_dir=str(run.run_dir.absolute()),
        log_path=str(log_path(root, run).absolute()),
        status_path=str(status_path(root, run).absolute()),
        cwd=os.getcwd(),  # the run config's relative paths (data, DeepSpeed JSON) are relative to here
    )


def report(spec: StudySpec, root: Path, runs: list[PlannedRun], study_file: Path) -> dict[str, Any]:
    analyses = build_analyses(spec.analyses, spec.axes)
    on_s = [run for run in runs if run.draw is None]  # the runs on S; S^i's enter only the leave-one-out numbers
    on_si = [run for run in runs if run.draw is not None]
    records = collect(root, on_s, [analysis.run_metrics for analysis in analyses.values()])
    loo_records = collect(root, on_si)
    cells = [cell.name for cell in expand_cells(spec)]
    results = aggregate(records, spec.axes, spec.metrics, spec.baseline, cells, spec.failure)
    sections = write_analyses(root, analyses, records, results)
    command = f"python run.py study --config {study_file}"
    write_results(root, results, name=spec.name, command=command, sections=sections)
    if spec.leave_one_out:
        failed = {run.key: r["error"] for run, r in zip(on_s + on_si, records + loo_records) if r["status"] == "failed"}
        stability = loo.measure(runs, cells, failed)
        loo.write(root, stability)
        measured = sum(len(cell.pairs) for cell in stability)
        print(f"[mtft] study {spec.name}: leave-one-out stability of {measured} pair(s) -> {root / 'loo.json'}")
    counts = {status: sum(r["status"] == status for r in records) for status in ("complete", "failed", "pending")}
    counts["damaged"] = 0
    for record in records + loo_records:  # in study.md among the failed runs; said here too, one line each
        if record.get("damaged"):
            print(f"[mtft] study {spec.name}: {record['run_dir']}: {record['error']}", file=sys.stderr, flush=True)
            counts["damaged"] += 1
    # a failed run on S^i is not in the tables, but its leave-one-out pair is missing: the study failed too
    pairs = [r for r in loo_records if r["status"] == "failed"]
    also = f" (and {len(pairs)} leave-one-out run(s) on S^i failed)" if pairs else ""
    print(
        f"[mtft] study {spec.name}: {counts['complete']} complete, {counts['failed']} failed, "
        f"{counts['pending']} pending{also} -> {root / 'study.md'}",
        flush=True,
    )
    counts["failed"] += len(pairs)
    return counts
