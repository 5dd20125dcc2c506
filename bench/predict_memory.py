"""Peak memory of ``run.py predict`` against the number of input rows: flat, since rows are read from the
datasets cache, encoded, predicted and written a chunk at a time (mtft.api.run.CHUNK_ROWS).

    python bench/predict_memory.py [--rows 20000 200000] [--keep DIR]

Trains one tiny run (the e2e base config, 2 steps, XNLI en), writes an XNLI-shaped input of each size (ids of the
user's own, ``doc-N``), runs ``python run.py predict`` on each as a child process, and prints each child's peak
resident memory (``ru_maxrss`` of that child alone, from ``os.wait4``), its time and rows per second, and the
ratio of the largest to the smallest input's peak. The output's ids are checked to be the input's, in order.

Measured here (2 CPU cores, 2026-11-28, `python bench/predict_memory.py`): 20,000 rows 630 MiB in 24.6 s, 200,000
rows 663 MiB in 167.8 s; peak at 200k / peak at 20k = 1.052 (before the rows were streamed the output grew by
about 1 KB a row: 620 MB more for 200k rows, issue 37).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORDS = "the a dog cat sleeps runs house river green old new small big sees eats not indeed maybe".split()


def child(argv: list[str], env: dict) -> tuple[int, float, float]:
    """(exit code, peak RSS in MiB, seconds) of ``python run.py ARGV``, measured for that child alone."""
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, "run.py", *argv], cwd=REPO, env=env, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode, usage.ru_maxrss / 1024, time.perf_counter() - start


def write_input(path: Path, rows: int) -> None:
    rng = random.Random(rows)
    with path.open("w", encoding="utf-8") as handle:
        for n in range(rows):
            premise = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12)))
            hypothesis = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 8)))
            handle.write(json.dumps({"id": f"doc-{n}", "premise": premise, "hypothesis": hypothesis}) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[20_000, 200_000])
    parser.add_argument("--keep", type=Path, default=None, help="work in this folder (default: a temporary one)")
    args = parser.parse_args()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "2"}
    with tempfile.TemporaryDirectory() as scratch:
        work = args.keep or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        env["MTFT_CACHE"] = str(work / "cache")
        env["HF_DATASETS_CACHE"] = str(work / "datasets")
        run = work / "run"
        if not (run / "best").is_dir():
            train = ["--config", "tests/e2e/base.yaml", f"run.output_dir={run}", "training.max_steps=2"]
            train += ["data.tasks=[{name: xnli, languages: [en], protocol: in_language}]", "run.overwrite=true"]
            code, _, _ = child(train, env)
            assert code == 0, "the tiny run failed"
        peaks = {}
        print(f"{'rows':>9} {'peak RSS MiB':>13} {'seconds':>8} {'rows/s':>8}")
        for rows in args.rows:
            source, out = work / f"in-{rows}.jsonl", work / f"out-{rows}.jsonl"
            write_input(source, rows)
            out.unlink(missing_ok=True)
            argv = ["predict", "--run", str(run), "--task", "xnli", "--input", str(source), "--out", str(out)]
            code, peak, seconds = child([*argv, "--no-progress"], env)
            assert code == 0, f"predict on {rows} rows failed"
            with out.open(encoding="utf-8") as handle:
                ids = [json.loads(line)["id"] for line in handle]
            assert ids == [f"doc-{n}" for n in range(rows)], "the output's ids are not the input's"
            peaks[rows] = peak
            print(f"{rows:>9,} {peak:>13.0f} {seconds:>8.1f} {rows / seconds:>8.0f}")
        small, large = min(peaks), max(peaks)
        print(f"peak at {large:,} rows / peak at {small:,} rows: {peaks[large] / peaks[small]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
