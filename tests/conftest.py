"""Shared test set-up: offline Hub, a private cache per session, and helpers to launch run.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

_DISTRIBUTED_VARS = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}


def pytest_collection_modifyitems(config, items):
    """Everything under tests/e2e/ runs the training loop: marked slow by directory, so that
    ``python -m pytest -m "not slow"`` is the fast loop (tests/unit/, about a minute)."""
    for item in items:
        if "e2e" in item.path.relative_to(REPO / "tests").parts:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session", autouse=True)
def private_cache(tmp_path_factory):
    """Tokenizers and datasets are cached in a folder of this test session, not the user's."""
    cache = tmp_path_factory.mktemp("cache")
    os.environ["MTFT_CACHE"] = str(cache / "mtft")
    os.environ["HF_DATASETS_CACHE"] = str(cache / "datasets")
    import datasets.config

    datasets.config.HF_DATASETS_CACHE = Path(os.environ["HF_DATASETS_CACHE"])
    return cache


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _DISTRIBUTED_VARS}
    env.update(extra)
    return env


def run_cli(*args: str, threads: int = 2, **env: str) -> subprocess.CompletedProcess:
    """``python run.py ARGS`` from the repository root."""
    return subprocess.run(
        [sys.executable, "run.py", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=clean_env(OMP_NUM_THREADS=str(threads), **env),
        timeout=600,
    )


def run_torchrun(*args: str, nproc: int = 2) -> subprocess.CompletedProcess:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        f"--master_port={port}",
        "run.py",
        *args,
    ]
    return subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, env=clean_env(OMP_NUM_THREADS="1"), timeout=600
    )


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


BASE_CONFIG = "tests/e2e/base.yaml"


def base_overrides(out: Path, steps: int, **extra) -> list[str]:
    """Overrides of the e2e base run (:data:`BASE_CONFIG`): output in ``out``, ``steps`` steps, plus ``extra``."""
    values = {"run.output_dir": str(out), "training.max_steps": steps, **extra}
    return [f"{k}={v}" for k, v in values.items()]


def demo_overrides(out: Path, steps: int, **extra) -> list[str]:
    """A shortened demo: fewer steps, a shorter pre-training of the backbone (one per test session, cached),
    no progress bar, output in ``out``."""
    values = {
        "run.output_dir": str(out),
        "training.max_steps": steps,
        "logging.progress_bar": "false",
        "pretrain.tokens": 102400,
        **extra,
    }
    return [f"{k}={v}" for k, v in values.items()]


@pytest.fixture
def repo() -> Path:
    return REPO
