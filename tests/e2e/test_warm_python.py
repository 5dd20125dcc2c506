"""The warm Python (tests/helpers/warm_python.py) launches a script as a fresh interpreter does: what the script
sees (argv, sys.path, working directory, environment, modules already imported, threads) and how it ends (exit
status, an uncaught exception's traceback, a signal, atexit handlers, files left open) are the same warm and cold,
whether the test process launches it or a launched run does through its ``sys.executable`` (warm_client.py: how
torchrun's ranks and a study's runs start). Its own launches only: a probe script, no run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.helpers.launch import REPO, WARM, clean_env, run_process, run_script

PROBE = """
import atexit, json, os, signal, sys
atexit.register(lambda: print("atexit ran", file=sys.stderr))
mode = sys.argv[1]
if mode == "report":
    import torch
    print(json.dumps({
        "argv": sys.argv, "path": sys.path, "cwd": os.getcwd(), "marker": os.environ.get("WARM_PROBE"),
        "mtft": "mtft" in sys.modules, "deepspeed": "deepspeed" in sys.modules, "threads": torch.get_num_threads(),
        "pgid_is_pid": os.getpgid(0) == os.getpid(),
    }))
elif mode == "exit":
    sys.exit(3)
elif mode == "raise":
    raise ValueError("probe")
elif mode == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
elif mode == "left-open":
    kept = open(sys.argv[2], "w")
    kept.write("written, never closed")
elif mode == "wait":
    print("waiting", flush=True)
    signal.pause()
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


def test_a_file_left_open_is_flushed_as_by_a_fresh_interpreter(probe, tmp_path):
    warm, cold = tmp_path / "warm.txt", tmp_path / "cold.txt"
    assert run_script(probe, "left-open", str(warm), threads=1).returncode == 0
    assert run_process([sys.executable, probe, "left-open", str(cold)], clean_env(), timeout=120).returncode == 0
    assert warm.read_text() == cold.read_text() == "written, never closed"


@pytest.fixture(scope="module")
def client():
    """The warm Python's ``sys.executable`` for the runs it forks."""
    if WARM.folder is None:
        pytest.fail("the session has no warm Python (MTFT_TESTS_COLD=1?)")
    if WARM.server is None or WARM.server.poll() is not None:
        WARM.start()  # the server writes the client
    return WARM.paths()[1]


@pytest.mark.parametrize("form", ["script", "-c", "-m"])
def test_a_run_launching_sys_executable_starts_a_fresh_interpreter_warm(probe, client, form, tmp_path):
    """What torchrun's ranks (``python -u SCRIPT``), a study's runs (``python -c BOOT``) and ``python -m`` see."""
    (tmp_path / "warm_probe_module.py").write_text(PROBE)
    command = {"script": ["-u", probe], "-c": ["-c", PROBE], "-m": ["-m", "warm_probe_module"]}[form]
    env = clean_env(OMP_NUM_THREADS="1", WARM_PROBE="x", PYTHONPATH=str(tmp_path))
    warm, cold = (run_process([python, *command, "report"], env, timeout=120) for python in (client, sys.executable))
    assert warm.returncode == cold.returncode == 0, warm.stderr + cold.stderr
    seen = [json.loads(result.stdout) for result in (warm, cold)]
    assert seen[0] == seen[1]
    first = {"script": os.path.dirname(probe), "-c": "", "-m": str(REPO)}[form]
    assert seen[0]["path"][:2] == [first, str(tmp_path)]
    assert not seen[0]["mtft"] and seen[0]["threads"] == 1 and seen[0]["pgid_is_pid"]
    assert warm.stderr == cold.stderr == "atexit ran\n"
    for mode, status in (("exit", 3), ("raise", 1), ("kill", -9)):
        ends = [run_process([python, "-u", probe, mode], env, timeout=120) for python in (client, sys.executable)]
        assert ends[0].returncode == ends[1].returncode == status, mode


def test_a_signal_to_the_launching_process_reaches_the_run_and_ends_it_the_same_way(probe, client):
    """torchrun stops its ranks, and a study its runs, with SIGTERM: the warm run gets it, and the client (the
    process torchrun sees) ends by it as a fresh interpreter would."""
    for python in (client, sys.executable):
        with subprocess.Popen(
            [python, probe, "wait"], stdout=subprocess.PIPE, text=True, env=clean_env(OMP_NUM_THREADS="1")
        ) as process:
            assert process.stdout is not None and process.stdout.readline() == "waiting\n"
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=60) == -signal.SIGTERM, python


def test_a_dead_reaper_is_one_error_naming_the_run(tmp_path):
    """The server answers the run's pid, then its connection closes before the status (its reaper died): the client's
    error names the run by its script and arguments, not only by a pid (a fake server: no process is launched)."""
    import socket
    import threading

    from tests.helpers.warm_client import Handover, command_line

    path = str(tmp_path / "server")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)

    def serve_then_die() -> None:
        connection, _ = listener.accept()
        _, fds, _, _ = socket.recv_fds(connection, 1, 3)
        for fd in fds:
            os.close(fd)
        connection.makefile("r").readline()  # the request
        connection.sendall(b'{"pid": 4242}\n')
        connection.close()

    server = threading.Thread(target=serve_then_die)
    server.start()
    with open(os.devnull, "rb") as null:
        run = Handover(path, {"script": "run.py", "argv": ["--config", "x.yaml"]}, [null.fileno()] * 3)
    server.join(timeout=10)
    try:
        assert run.pid == 4242
        with pytest.raises(RuntimeError, match=r"reaper of run 4242 \(run.py --config x.yaml\) died"):
            run.status(timeout=10)
    finally:
        run.close()
        listener.close()
    assert command_line({"module": "torch.distributed.run", "argv": ["--nproc-per-node", 2]}) == (
        "-m torch.distributed.run --nproc-per-node 2"
    )


def test_no_helper_module_stands_for_a_library(tmp_path):
    """The warm server runs as a script from tests/helpers/, which is then the first entry of its path: a helper
    named as a library (a ``packaging.py``) would be imported for it, by transformers, in every warm launch."""
    names = sorted(p.stem for p in (REPO / "tests" / "helpers").glob("*.py") if p.stem != "__init__")
    program = (
        "import importlib.util, json, sys; print(json.dumps([n for n in sys.argv[1:] if importlib.util.find_spec(n)]))"
    )
    found = subprocess.run(
        [sys.executable, "-c", program, *names], cwd=tmp_path, env=clean_env(), capture_output=True, text=True
    )
    assert found.returncode == 0, found.stderr[-2000:]
    assert json.loads(found.stdout) == []
