"""The warm Python (tests/e2e/helpers/warm_python.py) launches a script as a fresh interpreter does: what the script
sees (argv, sys.path, working directory, environment, modules already imported, threads) and how it ends (exit
status, an uncaught exception's traceback, a signal, atexit handlers) are the same warm and cold. Its own launches
only: a probe script, no run."""

from __future__ import annotations

import json
import sys

import pytest

from tests.conftest import WARM, clean_env, run_process, run_script

PROBE = """
import atexit, json, os, signal, sys
atexit.register(lambda: print("atexit ran", file=sys.stderr))
mode = sys.argv[1]
if mode == "report":
    import torch
    print(json.dumps({
        "argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(), "marker": os.environ.get("WARM_PROBE"),
        "mtft": "mtft" in sys.modules, "deepspeed": "deepspeed" in sys.modules, "threads": torch.get_num_threads(),
        "pgid_is_pid": os.getpgid(0) == os.getpid(),
    }))
elif mode == "exit":
    sys.exit(3)
elif mode == "raise":
    raise ValueError("probe")
elif mode == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    path = tmp_path_factory.mktemp("warm") / "probe.py"
    path.write_text(PROBE)
    return str(path)


def launch(probe: str, mode: str, warm: bool):
    if warm:
        assert WARM.folder is not None, "the session has no warm Python (MTFT_TESTS_COLD=1?)"
        return run_script(probe, mode, threads=1, WARM_PROBE="x")
    return run_process([sys.executable, probe, mode], clean_env(OMP_NUM_THREADS="1", WARM_PROBE="x"), timeout=120)


def test_a_warm_launch_sees_what_a_fresh_interpreter_sees(probe):
    warm, cold = (launch(probe, "report", w) for w in (True, False))
    assert warm.returncode == cold.returncode == 0, warm.stderr + cold.stderr
    seen = [json.loads(result.stdout) for result in (warm, cold)]
    assert seen[0] == seen[1]
    assert not seen[0]["mtft"] and not seen[0]["deepspeed"] and seen[0]["threads"] == 1 and seen[0]["pgid_is_pid"]
    assert warm.stderr == cold.stderr == "atexit ran\n"


@pytest.mark.parametrize("mode, status", [("exit", 3), ("raise", 1), ("kill", -9)])
def test_a_warm_launch_ends_as_a_fresh_interpreter_does(probe, mode, status):
    warm, cold = (launch(probe, mode, w) for w in (True, False))
    assert warm.returncode == cold.returncode == status
    if mode == "raise":
        assert "ValueError: probe" in warm.stderr and warm.stderr.splitlines()[-2:] == cold.stderr.splitlines()[-2:]
        assert warm.stderr.startswith("Traceback") and warm.stderr.endswith("atexit ran\n")
