"""Are runs bit-identical across a refactor? Four short runs, the sha256 of each one's final weights.

    python bench/identity.py                 # prints one line per run: name, sha256 of the last checkpoint's weights
    python bench/identity.py --out hashes.json

Run it on the commit before a change and on the change, and compare the lines (a refactor of the house must not move
a single bit). The runs: the demo (configs/demo.yaml: Multi-LoRA, LF-MLF with its floor, a short masked-LM
pre-training first), full fine-tuning with LF-MLF (tests/e2e/base.yaml), Multi-LoRA with LF-MLF, and two processes
under ZeRO-2 (torchrun, one thread each). Each is a fresh process with a private cache, offline.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASE = REPO / "tests/e2e/base.yaml"

RUNS: dict[str, tuple[str, list[str], int]] = {
    # name: (config, overrides, processes)
    "demo": (
        "configs/demo.yaml",
        [
            "training.max_steps=30",
            "pretrain.tokens=65536",
            "forgetting.enabled=false",
            "evaluation.every_steps=30",
            "checkpointing.every_steps=30",
        ],
        1,
    ),
    "lfmlf_full": (str(BASE), ["training.max_steps=16"], 1),
    "multi_lora_lfmlf": (str(BASE), ["training.max_steps=16", "model.adapter.method=multi_lora"], 1),
    "zero2_two_processes": (
        str(BASE),
        [
            "training.max_steps=16",
            "model.adapter.method=multi_lora",
            "training.deepspeed_config=configs/deepspeed/zero2.json",
            "training.micro_batch_size=16",
        ],
        2,
    ),
}


def final_weights(out: Path) -> Path:
    steps = sorted((out / "checkpoints").glob("step-*/model.safetensors"))
    if not steps:
        raise SystemExit(f"no checkpoint in {out}")
    return steps[-1]


def launch(config: str, overrides: list[str], processes: int, out: Path, cache: Path) -> None:
    environment = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "MTFT_CACHE": str(cache / "mtft"),
        "HF_DATASETS_CACHE": str(cache / "datasets"),
        "OMP_NUM_THREADS": "1" if processes > 1 else os.environ.get("OMP_NUM_THREADS", "2"),
    }
    arguments = ["run.py", "--config", config, f"run.output_dir={out}", *overrides]
    if processes > 1:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc_per_node={processes}",
            f"--master_port={port}",
            *arguments,
        ]
    else:
        command = [sys.executable, *arguments]
    done = subprocess.run(command, cwd=REPO, env=environment, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the hashes to this JSON file")
    parser.add_argument("--only", nargs="*", choices=sorted(RUNS), help="run only these")
    arguments = parser.parse_args()
    hashes = {}
    with tempfile.TemporaryDirectory() as folder:
        for name, (config, overrides, processes) in RUNS.items():
            if arguments.only and name not in arguments.only:
                continue
            out = Path(folder) / name
            launch(config, overrides, processes, out, Path(folder) / "cache")
            hashes[name] = hashlib.sha256(final_weights(out).read_bytes()).hexdigest()
            print(f"{name:22s} {hashes[name]}", flush=True)
    if arguments.out:
        arguments.out.write_text(json.dumps(hashes, indent=2) + "\n")


if __name__ == "__main__":
    main()
