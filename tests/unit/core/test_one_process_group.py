"""A run without a launcher sets up its one-process group on an in-memory store (mtft.core.distributed): no port is
picked first and bound later, so runs started side by side (a study's workers) cannot take each other's port between
the pick and the bind; DeepSpeed takes over the group, and torch's collectives run on it. (gloo's own listener stays:
it binds port 0 itself, which the kernel makes atomic.)"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers.launch import REPO, clean_env

PROGRAM = """
import json, os
import psutil, torch
import deepspeed.comm as ds_comm
from mtft.core.distributed import all_reduce_sum, init_distributed

info = init_distributed()
listening = [c.laddr.port for c in psutil.Process().net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
store = torch.distributed.distributed_c10d._get_default_store()  # the group's, under its "default_pg" prefix
print(json.dumps({
    "rank": info.rank, "world": info.world_size, "listening": len(listening),
    "store": type(getattr(store, "underlying_store", store)).__name__,
    "backend": torch.distributed.get_backend(), "deepspeed_world": ds_comm.get_world_size(),
    "sum": float(all_reduce_sum(torch.ones(3)).sum()), "master_port": os.environ.get("MASTER_PORT"),
}))
"""


def test_a_run_without_a_launcher_binds_no_port():
    env = clean_env(OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert (seen["rank"], seen["world"], seen["deepspeed_world"]) == (0, 1, 1)
    assert seen["backend"] == "gloo" and seen["sum"] == 3.0
    # env:// would add a TCPStore listening on MASTER_PORT, a port picked free before the store bound it
    assert seen["store"] == "HashStore" and seen["master_port"] is None and seen["listening"] <= 1
