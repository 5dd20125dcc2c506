"""Shared test set-up: offline Hub, a private cache per session, and helpers to launch run.py."""

from __future__ import annotations

import json
import os
import signal
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
    ``python -m pytest -m "not slow"`` is the fast loop (tests/unit/, about a minute). A multi-process test must
    carry its own ``@pytest.mark.timeout(N)``: a hung collective then fails that test instead of blocking CI."""
    untimed = []
    for item in items:
        if "e2e" in item.path.relative_to(REPO / "tests").parts:
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("multiprocess") and not item.get_closest_marker("timeout"):
            untimed.append(item.nodeid)
    if untimed:
        raise pytest.UsageError("marked multiprocess without @pytest.mark.timeout(N): " + ", ".join(untimed))


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


def run_process(command: list[str], env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    """``subprocess.run`` from the repository root that, on a timeout (``timeout`` here, or pytest-timeout's alarm
    in the test) or Ctrl-C, kills the child and every process below it: torchrun's ranks too, so that no orphaned
    rank is left waiting in a collective."""
    with subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except BaseException:
            kill_tree(process.pid)
            process.wait(timeout=60)
            raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def kill_tree(pid: int) -> None:
    """SIGKILL process ``pid`` (the leader of its own process group) and all its descendants. Killing the group is
    not enough: torchrun starts every rank in a session of its own, and a rank whose torchrun is gone is orphaned
    (reparented to init) where nothing finds it again; so the tree is listed first, with the leader stopped so
    that it starts no new process meanwhile, then each member's group is killed."""
    import psutil  # a dependency of DeepSpeed

    try:
        os.kill(pid, signal.SIGSTOP)
        members = psutil.Process(pid).children(recursive=True)
    except (ProcessLookupError, psutil.NoSuchProcess):
        members = []
    for target in [pid, *(member.pid for member in members)]:
        for kill in (os.killpg, os.kill):  # the member's group (a rank's own helpers), then the member itself
            try:
                kill(target, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def run_cli(*args: str, threads: int = 2, timeout: float = 600, **env: str) -> subprocess.CompletedProcess:
    """``python run.py ARGS`` from the repository root."""
    return run_process([sys.executable, "run.py", *args], clean_env(OMP_NUM_THREADS=str(threads), **env), timeout)


def run_torchrun(*args: str, nproc: int = 2, timeout: float = 600) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node=NPROC run.py ARGS`` on a free local port; a timeout kills every rank."""
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
    return run_process(command, clean_env(OMP_NUM_THREADS="1"), timeout)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


BASE_CONFIG = "tests/e2e/base.yaml"


def base_overrides(out: Path, steps: int, **extra) -> list[str]:
    """Overrides of the e2e base run (:data:`BASE_CONFIG`): output in ``out``, ``steps`` steps, plus ``extra``
    (``{"a.b": value}``). A string is passed as written (YAML, e.g. ``"[en, de]"``); any other value as JSON, so
    ``None`` is null, ``False`` false and a dict or list a whole mapping or list."""
    values = {"run.output_dir": str(out), "training.max_steps": steps, **extra}
    return [f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in values.items()]


@pytest.fixture
def repo() -> Path:
    return REPO
