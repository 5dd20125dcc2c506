"""What the test suite costs, file by file and test by test, and what it covers.

    python bench/test_suite.py                      # the whole suite (the README's pytest command), timed
    python bench/test_suite.py --coverage           # the same under coverage.py: line and branch coverage of mtft/
    python bench/test_suite.py -- -m "not slow"     # any pytest arguments after --

It runs ``python -m pytest`` as the README does (setup.cfg's options: a worker per core) with a JUnit report, then
prints the wall time, the seconds summed over the tests, the files by their seconds, the slowest tests and the
runs the tests launched (``MTFT_TESTS_LAUNCH_LOG``, tests/helpers/launch.py) by file; with
``--coverage`` also the line and branch coverage of ``mtft/``, subprocesses (``run.py``, torchrun's ranks, study
jobs) and the warm Python's forks included. docs/results.md ("The test suite's cost") keeps the last measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

COVERAGE_RC = """[run]
branch = True
source = mtft
parallel = True
patch = subprocess, fork
data_file = {data}
"""


def tests_of(junit: Path) -> dict[str, float]:
    """Seconds per test (set-up and tear-down included) from pytest's JUnit report."""
    seconds = {}
    for case in ElementTree.parse(junit).iter("testcase"):
        path = case.get("classname", "").replace(".", "/")
        seconds[f"{path}.py::{case.get('name')}"] = float(case.get("time", 0.0))
    return seconds


def file_of(test: str) -> str:
    """``tests/e2e/test_x.py`` of ``tests/e2e/test_x/Class.py::name`` or ``tests/e2e/test_x.py::name``."""
    path = test.split("::")[0][: -len(".py")]
    while path and not (REPO / f"{path}.py").is_file() and "/" in path:
        path = path.rsplit("/", 1)[0]
    return f"{path}.py"


def print_launches(launches: list[dict], top: int) -> None:
    """The warm launches (``run.py``, torchrun, a study's runs: tests/helpers/launch.py) by test file: how much of the
    suite's time is runs started from the tests, and whose."""
    files: dict[str, list[float]] = defaultdict(list)
    for launch in launches:
        files[launch["test"].split("::")[0] or "(outside a test)"].append(launch["seconds"])
    total = sum(launch["seconds"] for launch in launches)
    print(f"\n{len(launches)} launches, {total:.0f} s summed\n\n| seconds | launches | file |\n|---:|---:|---|")
    for name, values in sorted(files.items(), key=lambda item: -sum(item[1]))[:top]:
        print(f"| {sum(values):.1f} | {len(values)} | {name} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--coverage", action="store_true", help="also measure line and branch coverage of mtft/")
    parser.add_argument("--top", type=int, default=15, help="how many files and tests to list")
    parser.add_argument("pytest_args", nargs="*", help="arguments for pytest (after --)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as folder:
        junit = Path(folder) / "junit.xml"
        launches = Path(folder) / "launches.jsonl"  # tests/helpers/launch.py: one line per run.py (or other) launch
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "MTFT_TESTS_LAUNCH_LOG": str(launches)}
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--junitxml={junit}", *args.pytest_args]
        if args.coverage:
            rc = Path(folder) / "coveragerc"
            rc.write_text(COVERAGE_RC.format(data=Path(folder) / ".coverage"))
            env["COVERAGE_RCFILE"] = str(rc)
            command = [sys.executable, "-m", "coverage", "run", *command[1:]]
        start = time.perf_counter()
        status = subprocess.call(command, cwd=REPO, env=env)
        wall = time.perf_counter() - start
        seconds = tests_of(junit)
        files: dict[str, float] = defaultdict(float)
        for test, value in seconds.items():
            files[file_of(test)] += value
        print(f"\npytest exit status {status}; {len(seconds)} tests; wall {wall:.0f} s ({wall / 60:.1f} min); ")
        print(f"{sum(seconds.values()):.0f} s summed over the tests (the workers run them side by side)\n")
        print("| seconds | file |\n|---:|---|")
        for name, value in sorted(files.items(), key=lambda item: -item[1])[: args.top]:
            print(f"| {value:.1f} | {name} |")
        print("\n| seconds | test |\n|---:|---|")
        for name, value in sorted(seconds.items(), key=lambda item: -item[1])[: args.top]:
            print(f"| {value:.1f} | {name} |")
        if launches.exists():
            print_launches([json.loads(line) for line in launches.read_text().splitlines()], args.top)
        if args.coverage:
            subprocess.run([sys.executable, "-m", "coverage", "combine", "-q"], cwd=REPO, env=env, check=True)
            report = Path(folder) / "coverage.json"
            subprocess.run(
                [sys.executable, "-m", "coverage", "json", "-q", "-o", str(report)], cwd=REPO, env=env, check=True
            )
            totals = json.loads(report.read_text())["totals"]
            print(
                f"\ncoverage of mtft/: lines {totals['covered_lines']}/{totals['num_statements']} "
                f"({100 * totals['covered_lines'] / totals['num_statements']:.2f}%), branches "
                f"{totals['covered_branches']}/{totals['num_branches']} "
                f"({100 * totals['covered_branches'] / totals['num_branches']:.2f}%)"
            )
    sys.exit(status)


if __name__ == "__main__":
    main()
