"""Study files and their plans for the study tests, why a launched study's runs failed, and a complete 2 × 2 grid of
run records with random metrics."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import yaml

from mtft.study.aggregate import run_record
from mtft.study.plan import plan_runs
from mtft.study.spec import load_study
from mtft.study.state import read_status
from tests.helpers.launch import REPO


def write_study(tmp_path: Path, **fields) -> Path:
    study = {
        "name": "s",
        "base": str(REPO / "configs" / "demo.yaml"),
        "grid": {"training.optimizer.lr": [0.001, 0.01]},
        "seeds": [0, 1],
        "output_dir": str(tmp_path / "study"),
        **fields,
    }
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False), encoding="utf-8")
    return path


def study_failure(done: subprocess.CompletedProcess, out: Path, lines: int = 25) -> str:
    """What a failed study's assertion should show: its own ``[mtft]`` lines (its stderr is mostly progress bars)
    and, for each run its status records as failed, the error line and the last ``lines`` lines of the run's log --
    the cause of a failure seen once in CI, not only that a run failed."""
    said = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith(("[mtft]", "error"))]
    parts = ["\n".join(said[-20:])]
    for status in sorted((out / "status").glob("**/*.json")):
        record = read_status(status)  # the study's own reader: a damaged file is {}, not an error of this helper
        if record.get("status") != "failed":
            continue
        log = out / "logs" / status.relative_to(out / "status").with_suffix(".log")
        tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:] if log.is_file() else []
        parts.append(f"--- {status.relative_to(out)}: {record.get('error')}\n" + "\n".join(tail))
    return "\n".join(parts)


def plan(path: Path, *overrides: str):
    """The study file's spec and its planned runs."""
    spec, base = load_study(path, overrides)
    return spec, plan_runs(spec, base, path)


AXES = ["variant", "training.optimizer.lr"]


CELLS = [f"{v}_lr-{lr}" for v in ("mean", "mgda") for lr in (0.001, 0.01)]


def grid_records(seeds=(0, 1, 2, 3), rng_seed=0) -> list[dict]:
    """A 2 × 2 grid (variant × lr), every run complete with random metrics."""
    rng = np.random.default_rng(rng_seed)
    records = []
    for variant in ("mean", "mgda"):
        for lr in (0.001, 0.01):
            for seed in seeds:
                metrics = {
                    "xnli/accuracy": float(rng.uniform(0.6, 0.9)),
                    "xnli/en/accuracy": float(rng.uniform(0.7, 0.95)),
                    "xnli/ar/accuracy": float(rng.uniform(0.5, 0.8)),
                    "F_p_final": float(rng.uniform(0, 2)),
                    "wall_s": float(rng.uniform(50, 100)),
                }
                axes = {"variant": variant, "training.optimizer.lr": lr}
                records.append(run_record(f"{variant}_lr-{lr}", axes, seed, metrics=metrics))
    return records
