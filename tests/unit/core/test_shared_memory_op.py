"""DeepSpeed's CPU shared-memory op is never built (mtft.core.distributed.no_shared_memory_op): its first build took
minutes under a lock file that a killed build left behind, on which every later start waited forever; the op serves
inference_all_reduce only, which training never calls."""

from __future__ import annotations

import importlib
import subprocess
import sys

from tests.helpers.launch import REPO, clean_env


def test_the_op_is_not_built_and_training_collectives_are_torchs(tmp_path):
    program = (
        "import importlib, os\n"
        "from mtft.core.distributed import init_distributed, all_reduce_sum\n"
        "import torch\n"
        "init_distributed()\n"
        "print(importlib.import_module('deepspeed.comm.torch').build_shm_op() is None)\n"
        "print(float(all_reduce_sum(torch.ones(3)).sum()))\n"
    )
    env = clean_env(TORCH_EXTENSIONS_DIR=str(tmp_path / "extensions"), OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, "-c", program], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "3.0"]
    assert not (tmp_path / "extensions").exists()  # nothing compiled, no lock file to be left behind
    assert "built successfully" not in out.stdout + out.stderr


def test_the_patch_names_deepspeeds_module_not_torch():
    from mtft.core.distributed import no_shared_memory_op

    no_shared_memory_op()
    import torch

    assert importlib.import_module("deepspeed.comm.torch").build_shm_op() is None
    assert not hasattr(torch, "build_shm_op")
