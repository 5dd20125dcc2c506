"""Run many ``run.py`` invocations in one Python process (torch imported once), as ``python run.py ARGS`` would:
``run.py``'s own ``__main__`` block runs, so a UserError prints one line and exits 2, and anything else escapes
as the traceback a user would see. Usage: ``python run_cases.py cases.json results.json`` with cases
``[{"id", "argv", "watch": [dirs]}]``; each result holds the exit code, the output, the files that appeared and
whether DeepSpeed has been imported so far."""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import sys
import traceback


def listing(roots: list[str]) -> set[str]:
    found = set()
    for root in roots:
        for folder, dirs, files in os.walk(root):
            found.update(os.path.join(folder, name) for name in dirs + files)
    return found


def run_case(argv: list[str], watch: list[str]) -> dict:
    before = listing(watch)
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        sys.argv = ["run.py", *argv]
        try:
            runpy.run_path("run.py", run_name="__main__")
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
        except BaseException:  # what python itself would print before exiting 1
            traceback.print_exc()
            code = 1
    return {
        "code": code,
        "output": out.getvalue() + err.getvalue(),
        "new": sorted(listing(watch) - before),
        # DeepSpeed imported (the process group starts it) by this case or an earlier one of this process
        "deepspeed": "deepspeed" in sys.modules,
    }


def main() -> None:
    cases_file, results_file = sys.argv[1:3]  # before each case replaces sys.argv
    sys.path[0] = os.getcwd()  # the repository root, as for python run.py (not this helper's folder)
    with open(cases_file, encoding="utf-8") as handle:
        cases = json.load(handle)
    results = {case["id"]: run_case(case["argv"], case["watch"]) for case in cases}
    with open(results_file, "w", encoding="utf-8") as handle:
        json.dump(results, handle)


if __name__ == "__main__":
    main()
