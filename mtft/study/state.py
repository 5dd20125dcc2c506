"""The study directory and what it knows about each run.

Layout::

    <study>/COMPLETE              marker {"kind": "study", "name": ...}: this folder is that study's
    <study>/study.yaml            the study file as last run (for the record)
    <study>/configs/<cell>/seed-<n>.yaml   each run's resolved config (what the job launches)
    <study>/runs/<cell>/seed-<n>/          each run: an ordinary run directory, re-runnable by hand
    <study>/logs/<cell>/seed-<n>.log       each run's console output
    <study>/status/<cell>/seed-<n>.json    the last attempt: finished / failed (with its error line) / interrupted

A leave_one_out study adds, beside each seed's files, ``seed-<n>-loo-<i>`` ones: the runs on S^i of draw i.

A run is *finished* when its run directory holds ``metrics.json`` (written last, atomically, by the trainer); its
status file only says what happened to the last attempt. A run directory without ``metrics.json`` is resumed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from mtft.core.atomic import AtomicFolder, is_complete, marker, write_json, write_text
from mtft.core.errors import ConfigError
from mtft.study.plan import PlannedRun, config_difference

KIND = "study"


def open_study_dir(root: Path, name: str, study_text: str) -> None:
    """Create ``root`` for study ``name``, or accept it if it already is that study; refuse anything else."""
    root = Path(root)
    if root.exists():
        found = marker(root) if is_complete(root) else {}
        if found.get("kind") != KIND:
            what = "is not a study directory" if any(root.iterdir()) else ""
            if what:
                raise ConfigError(f"{root} {what} (no study marker); choose another output_dir")
            root.rmdir()  # an empty folder: take it
        elif found.get("name") != name:
            raise ConfigError(
                f"{root} holds study {found.get('name')!r}, not {name!r}; choose another output_dir for this one"
            )
    if not root.exists():
        with AtomicFolder(root).writing(kind=KIND, name=name) as partial:
            (partial / "study.yaml").write_text(study_text, encoding="utf-8")
    else:
        write_text(root / "study.yaml", study_text)


def check_run_configs(runs: list[PlannedRun]) -> None:
    """A run already planned with another config is refused (the study changed under its results)."""
    for run in runs:
        if run.config_path.is_file():
            difference = config_difference(run.config_path.read_text(encoding="utf-8"), run.config_yaml)
            if difference:
                raise ConfigError(
                    f"{run.key} was run with a different config ({difference}); "
                    "restore the study file, or give the changed study another output_dir"
                )


def write_run_configs(runs: list[PlannedRun]) -> None:
    for run in runs:
        if not run.config_path.is_file():
            run.config_path.parent.mkdir(parents=True, exist_ok=True)
            write_text(run.config_path, run.config_yaml)


def is_finished(run_dir: Path) -> bool:
    return is_complete(run_dir) and (Path(run_dir) / "metrics.json").is_file()


def is_started(run_dir: Path) -> bool:
    return is_complete(run_dir)


def status_path(root: Path, run: PlannedRun) -> Path:
    return Path(root) / "status" / run.cell.name / f"{run.slot}.json"


def log_path(root: Path, run: PlannedRun) -> Path:
    return Path(root) / "logs" / run.cell.name / f"{run.slot}.log"


def read_status(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def record_attempt(
    path: Path,
    status: str,
    returncode: Optional[int],
    seconds: float,
    error: Optional[str],
    code: Optional[dict[str, Optional[str]]] = None,
) -> None:
    """Write the outcome of one attempt; wall time adds up over the attempts of a resumed run. ``code`` is the
    version of mtft that ran it (:func:`mtft.core.version.code_version`); a run resumed under other code keeps
    every version it ran under, so the report can say it is mixed."""
    previous = read_status(path)
    versions = list(previous.get("code", []))
    if code and code not in versions:
        versions.append(code)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(
        path,
        {
            "status": status,
            "returncode": returncode,
            "error": error,
            "attempts": int(previous.get("attempts", 0)) + 1,
            "wall_s": float(previous.get("wall_s", 0.0)) + seconds,
            "code": versions,
        },
    )
