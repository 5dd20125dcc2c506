"""An installed mtft at home outside the checkout: the wheel in a fresh virtual environment, its ``mtft`` command run
from an empty folder of the user's own -- a run of a tiny config with the user's data and no file of the checkout
(the default DeepSpeed stage is built in), then ``mtft predict`` on it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, clean_env, read_jsonl

ROWS = 24


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A virtual environment with the wheel of this checkout (its dependencies from the running interpreter's
    site-packages: --system-site-packages; mtft itself only from the wheel)."""
    root = tmp_path_factory.mktemp("installed")
    wheels = root / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(REPO)],
        check=True,
        capture_output=True,
    )
    env = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(env)], check=True)
    wheel = next(wheels.glob("mtft-*.whl"))
    subprocess.run([str(env / "bin" / "pip"), "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True)
    return env


def fixture_rows(language: str, split: str) -> str:
    lines = (REPO / f"tasks/xnli/fixtures/xnli/{language}/{split}.jsonl").read_text(encoding="utf-8").splitlines()
    return "\n".join(lines[:ROWS]) + "\n"


def test_the_installed_command_trains_and_predicts_from_an_empty_folder(venv, tmp_path):
    home = tmp_path / "my project"  # a user's folder, a space in its name
    (home / "data").mkdir(parents=True)
    for language in ("en", "de"):
        for split in ("train", "validation"):
            (home / "data" / language).mkdir(exist_ok=True)
            (home / "data" / language / f"{split}.jsonl").write_text(fixture_rows(language, split), encoding="utf-8")
    config = {
        "run": {"name": "mine", "output_dir": "runs/mine"},
        "model": {"backbone": "tiny", "dropout": 0.0, "tiny": {"hidden_size": 32, "vocab_size": 200}},
        "data": {
            "tasks": [{"name": "xnli", "languages": ["en", "de"], "protocol": "in_language"}],
            "sources": {"facebook/xnli": "data/{name}/{split}.jsonl"},
            "max_length": 32,
        },
        "training": {"max_steps": 3, "micro_batch_size": 8},
        "logging": {"progress_bar": False},
    }
    (home / "mine.yaml").write_text(json.dumps(config))  # JSON is YAML
    mtft = str(venv / "bin" / "mtft")
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import mtft; print(mtft.__file__)"],
        cwd=home,
        capture_output=True,
        text=True,
    )
    assert str(venv) in where.stdout  # the wheel's mtft, not the checkout's
    env = clean_env(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1")
    trained = subprocess.run(
        [mtft, "train", "--config", "mine.yaml"], cwd=home, env=env, capture_output=True, text=True, timeout=600
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    run = home / "runs" / "mine"
    assert json.loads((run / "metrics.json").read_text())["step"] == 3
    assert "zero0" in (run / "config.yaml").read_text()  # the built-in stage, no configs/ folder needed
    (home / "new.jsonl").write_text(json.dumps({"id": 7, "premise": "a b", "hypothesis": "c"}) + "\n")
    argv = ["predict", "--run", "runs/mine", "--task", "xnli", "--input", "new.jsonl", "--out", "p.jsonl"]
    predicted = subprocess.run([mtft, *argv], cwd=home, env=env, capture_output=True, text=True, timeout=600)
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    assert read_jsonl(home / "p.jsonl")[0]["id"] == 7
