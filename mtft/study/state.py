"""The study directory and what it knows about each run.

Layout::

    <study>/COMPLETE              marker {"kind": "study", "name": ...}: this folder is that study's
    <study>/study.yaml            the study file as last run (for the record)
    <study>/configs/<cell>/seed-<n>.yaml   each run's resolved config (what the job launches)
    <study>/runs/<cell>/seed-<n>/          each run: an ordinary run directory, re-runnable by hand
    <study>/logs/<cell>/seed-<n>.log       each run's console output
    <study>/status/<cell>/seed-<n>.json    the last attempt: finished / failed (with its error line) / interrupted;
                                           while an attempt runs, also the source and time it was launched with

A leave_one_out study adds, beside each seed's files, ``seed-<n>-loo-<i>`` ones: the runs on S^i of draw i.

A run is *finished* when its run directory holds ``metrics.json`` (written last, atomically, by the trainer); its
status file only says what happened to the last attempt. A run directory without ``metrics.json`` is resumed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

import yaml

from mtft.core.atomic import AtomicFolder, is_complete, marker, write_json, write_text
from mtft.core.errors import ConfigError, shorten
from mtft.study.plan import PlannedRun, config_difference

KIND = "study"


def check_study_dir(root: Path, name: str, existing: bool = False) -> None:
    """Refuse ``root`` unless it is study ``name``'s folder, or (``existing`` False) absent or empty: nothing is
    written, so a refused command leaves the folder as it was."""
    root = Path(root)
    if not root.exists():
        if existing:
            raise ConfigError(f"--report-only: study directory {root} does not exist; run the study first")
        return
    if not root.is_dir():
        raise ConfigError(f"{root} is a file, not a study directory; choose another output_dir")
    found = marker(root) if is_complete(root) else {}
    if found.get("kind") != KIND:
        if existing or any(root.iterdir()):
            raise ConfigError(f"{root} is not a study directory (no study marker); choose another output_dir")
    elif found.get("name") != name:
        raise ConfigError(
            f"{root} holds study {found.get('name')!r}, not {name!r}; choose another output_dir for this one"
        )


def check_no_links(root: Path) -> None:
    """Refuse a study folder holding a symbolic link anywhere inside (a log, a run's ``train.log``, a checkpoint):
    continuing would append to, replace or delete what it points to, outside the folder. mtft makes none."""
    for folder, dirs, files in os.walk(root):  # followlinks=False: a linked folder is listed, never entered
        for name in dirs + files:
            path = Path(folder) / name
            if path.is_symlink():
                raise ConfigError(
                    f"{path} is a symbolic link (to {os.readlink(path)}); the study would write through it, outside "
                    "its folder: replace it by the file or folder itself, or remove it"
                )


def open_study_dir(root: Path, name: str, study_text: str) -> None:
    """Create ``root`` for study ``name``, or accept it if it already is that study; refuse anything else."""
    root = Path(root)
    check_study_dir(root, name)
    if root.exists() and not is_complete(root):
        root.rmdir()  # an empty folder: take it
    if not root.exists():
        with AtomicFolder(root).writing(kind=KIND, name=name) as partial:
            (partial / "study.yaml").write_text(study_text, encoding="utf-8")
    else:
        write_text(root / "study.yaml", study_text)


def check_run_configs(runs: list[PlannedRun]) -> None:
    """A run already planned with another config is refused (the study changed under its results)."""
    for run in runs:
        if run.config_path.is_file():
            try:
                difference = config_difference(run.config_path.read_text(encoding="utf-8"), run.config_yaml)
            except (UnicodeDecodeError, yaml.YAMLError) as error:
                raise ConfigError(
                    f"{run.config_path} is not the config the study wrote for {run.key} ({type(error).__name__}: "
                    f"{shorten(str(error))}); restore it, or give the study another output_dir"
                ) from None
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


def record_launch(path: Path, code: dict[str, Optional[str]], at: float) -> None:
    """Before an attempt starts, note in its status file the source it runs and when it started (``time.time()``),
    so that a study killed between the run's end and :func:`record_attempt` can still recover both
    (:func:`recovered_status`). The last attempt's outcome is left as it was until the attempt ends."""
    status = read_status(path)
    versions = list(status.get("code", []))
    if code not in versions:
        versions.append(code)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, {**status, "code": versions, "launched_at": at})


def recovered_status(path: Path, run_dir: Path) -> Optional[dict[str, Any]]:
    """The status of a finished run whose study died before recording it (the run wrote ``metrics.json``, the study
    was killed before :func:`record_attempt`), from what the run and its launch note hold: the source is the one
    noted at launch; the last attempt's wall time runs from the launch to ``metrics.json``'s modification time
    (written last, atomically, by the trainer). Without a launch note (a status from an older mtft) the wall time
    cannot be known and is left out. None when there is nothing to recover."""
    status = read_status(path)
    if not is_finished(run_dir) or status.get("status") == "finished":
        return None
    recovered: dict[str, Any] = {
        "status": "finished",
        "returncode": None,  # the study did not see the process end
        "error": None,
        "attempts": int(status.get("attempts", 0)) + 1,
        "code": list(status.get("code", [])),
        "recovered": "recorded from the run directory after the study was stopped before recording it",
    }
    launched = status.get("launched_at")
    if isinstance(launched, (int, float)):
        end = (Path(run_dir) / "metrics.json").stat().st_mtime
        recovered["wall_s"] = float(status.get("wall_s", 0.0)) + max(0.0, end - launched)
    else:
        recovered["recovered"] += "; its last attempt's wall time is unknown"
    return recovered


def recover_status(path: Path, run_dir: Path) -> None:
    """Write :func:`recovered_status` where there is one."""
    recovered = recovered_status(path, run_dir)
    if recovered is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, recovered)
