"""A warm Python for the end-to-end tests: a server that imports once the third-party libraries every
``python run.py`` imports (torch, transformers, PEFT, datasets, scikit-learn, SciPy: about 3 s of every launch on
2 cores, most of a short run) and then forks one fresh child per launch, which runs ``run.py`` (or a helper
script) as ``python SCRIPT ARGS`` would: its own process, process group, environment, working directory, argv and
output files, its ``__main__`` run by runpy, an uncaught exception printed by the interpreter and exit status 1,
atexit handlers and all at the end.

Why this is sound: the server imports libraries but runs nothing (no tensor op, no thread pool, no process group),
so each child starts from the state a fresh interpreter has right after those imports. mtft itself and DeepSpeed
are NOT imported here: each child imports them as a fresh process would, so every import-time effect of the code
under test (DeepSpeed's accelerator lines, module-level registries, environment read at import) happens in the child,
and a test that a refusal comes before DeepSpeed starts still sees it. What the libraries read from the environment
when imported is the server's environment: the test session's (tests/conftest.py starts the server after setting its
cache variables and Hub offline mode), which every launch inherits anyway. ``MTFT_TESTS_COLD=1`` makes every launch a
fresh interpreter instead (tests/conftest.py), for a test whose failure one suspects of the warm start.

Protocol (a Unix socket, one JSON line each way): the client sends ``{"script" (or "module", for python -m),
"argv", "env", "cwd", "stdout", "stderr", "threads"}``; the server answers ``{"pid": N}`` once the child runs,
then ``{"status": S}`` (an exit code, or minus the signal that ended it, as ``subprocess`` reports it) when it has
ended.

    python tests/e2e/helpers/warm_python.py SOCKET_PATH
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import signal
import socket
import sys

#: what a run imports before it reaches mtft's own code, heaviest first; mtft and deepspeed are left to the child
PRELOAD = (
    "torch",
    "transformers",
    "transformers.modeling_utils",
    "transformers.models.bert.modeling_bert",
    "transformers.models.xlm_roberta.modeling_xlm_roberta",
    "peft",
    "datasets",
    "sklearn.metrics",
    "scipy.stats",
    "scipy.optimize",
    "seqeval.metrics",
    "safetensors.torch",
)


def serve(path: str) -> dict:
    """Accept launches forever; return only in a forked child, with the launch it must run. Each launch gets a
    reaper process (a child of the server) that forks the run, reports its pid, waits for it and reports its status,
    so that the server goes back to accepting at once and reaps nothing itself."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the reapers are reaped by the kernel
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(8)
    print("ready", flush=True)
    while True:
        connection, _ = listener.accept()
        if os.fork() == 0:  # the reaper
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # waitpid of its own child needs the default
            stream = connection.makefile("rw", encoding="utf-8")
            request = json.loads(stream.readline())
            pid = os.fork()
            if pid == 0:  # the run
                stream.close()
                connection.close()
                return request
            stream.write(json.dumps({"pid": pid}) + "\n")
            stream.flush()
            _, status = os.waitpid(pid, 0)
            stream.write(json.dumps({"status": os.waitstatus_to_exitcode(status)}) + "\n")
            stream.flush()
            os._exit(0)
        connection.close()


def become(request: dict) -> None:
    """Turn this forked child into ``python SCRIPT ARGS`` started in ``cwd`` with ``env``."""
    os.setsid()  # a process group of its own, as the tests' subprocesses get (start_new_session)
    for fd, name, flags in (
        (0, os.devnull, os.O_RDONLY),
        (1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
    ):
        opened = os.open(name, flags, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if request.get("module"):
        sys.argv = [request["module"], *request["argv"]]  # runpy.run_module puts the module's file in argv[0]
        sys.path[0] = os.getcwd()  # as for python -m MODULE
    else:
        sys.argv = [request["script"], *request["argv"]]
        sys.path[0] = os.path.dirname(os.path.abspath(request["script"]))  # as for python SCRIPT
    import torch

    torch.set_num_threads(int(request["threads"]))  # OMP_NUM_THREADS was read when torch was loaded here


def main() -> None:
    path = sys.argv[1]
    for name in PRELOAD:
        importlib.import_module(name)
    request = serve(path)
    become(request)
    if request.get("module"):
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(os.path.abspath(request["script"]), run_name="__main__")


if __name__ == "__main__":
    main()
