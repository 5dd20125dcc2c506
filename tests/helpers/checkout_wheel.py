"""The wheel of this checkout, built from a copy of its sources (setup.cfg, pyproject.toml, README, mtft/, tasks/):
so that the build neither writes into the working tree (``build/``, ``mtft.egg-info`` -- beside runs that other
workers start from it at the same time) nor packs stale files of an earlier ``build/`` folder."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers.launch import REPO

SOURCES = ("setup.cfg", "pyproject.toml", "README.md", "mtft", "tasks")


def build_wheel(folder: Path) -> Path:
    """Copy the sources into ``folder/source``, build the wheel into ``folder/wheel``; its path."""
    source, out = folder / "source", folder / "wheel"
    source.mkdir(parents=True)
    out.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(REPO / name, source / name)
    command = ["pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(out), str(source)]
    result = subprocess.run([sys.executable, "-m", *command], cwd=out, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    (built,) = out.glob("mtft-*.whl")
    return built
