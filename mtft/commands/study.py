"""``run.py study --config configs/studies/<name>.yaml [key=value ...]``: a grid of runs over seeds, executed
here (``executor.name: local``) or as a Slurm job array (``slurm``), aggregated into ``study.md``,
``results.csv``, ``results.json`` and plots in the study directory. Re-running the same command continues the
study: finished runs are kept, interrupted ones resume, failed ones are retried."""

from __future__ import annotations

import argparse
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="run.py study", description=__doc__)
    parser.add_argument("--config", required=True, help="study file, e.g. configs/studies/tiny.yaml")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="override the study file: num_seeds=2, executor.workers=1, overrides.training.max_steps=50 "
        "(a run-config key for every run)",
    )
    parser.add_argument("--report-only", action="store_true", help="aggregate the runs on disk; run nothing")
    return parser


def main(args: argparse.Namespace) -> int:
    from mtft.study.runner import run_study
    from mtft.study.spec import load_study

    spec, base = load_study(args.config, args.overrides)
    counts = run_study(spec, base, Path(args.config), report_only=args.report_only)
    # --report-only reports failed runs without failing itself; a damaged record (a run's metrics.json that cannot
    # be read) fails it: the report it wrote is short of that run's numbers
    return 1 if counts["damaged"] or (counts["failed"] and not args.report_only) else 0
