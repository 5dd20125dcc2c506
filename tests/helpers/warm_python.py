"""A warm Python for the end-to-end tests: a server that imports once the third-party libraries every
``python run.py`` imports (torch, transformers, PEFT, datasets, scikit-learn, SciPy: about 3 s of every launch on
2 cores, most of a short run) and then forks one fresh child per launch, which runs a script, a module or a ``-c``
program as ``python SCRIPT ARGS`` (``-m MODULE``, ``-c CODE``) would: its own process, session, environment,
working directory, argv, ``sys.path`` and standard streams, its ``__main__`` run by runpy, an uncaught exception
printed by the interpreter and exit status 1, atexit handlers and all at the end.

Why this is sound: the server imports libraries but runs nothing (no tensor op, no thread pool, no process group),
so each child starts from the state a fresh interpreter has right after those imports. mtft itself and DeepSpeed
are NOT imported here: each child imports them as a fresh process would, so every import-time effect of the code
under test (DeepSpeed's accelerator lines, module-level registries, environment read at import) happens in the child,
and a test that a refusal comes before DeepSpeed starts still sees it. What the libraries read from the environment
when imported is the server's environment: the test session's (tests/conftest.py starts the server after setting its
cache variables and Hub offline mode), which every launch inherits anyway. ``MTFT_TESTS_COLD=1`` makes every launch a
fresh interpreter instead (tests/conftest.py), for a test whose failure one suspects of the warm start.

Launches come from two clients: the test process (tests/helpers/launch.py ``WarmPython``) and ``warm_client.py``, which
a launched run's own launches of ``sys.executable`` reach: in a forked child ``sys.executable`` is a small
executable (written by :func:`write_client`) that hands its command to this server, so torchrun's ranks and a
study's runs are forked warm too, each in its turn a fresh process as above.

Protocol (a Unix socket): the client sends one byte with its standard input, output and error attached
(``SCM_RIGHTS``), then one JSON line ``{"script" | "module" | "code", "argv", "env", "cwd", "threads",
"unbuffered"}``; the server answers ``{"pid": N}`` once the child runs, then ``{"status": S}`` (an exit code, or
minus the signal that ended it, as ``subprocess`` reports it) when it has ended. A client that goes away first
(killed, say, by torchrun tearing its ranks down, or by a test's timeout) takes its child with it: the child's
process group is killed.

    python tests/helpers/warm_python.py SOCKET_PATH CLIENT_PATH
"""

from __future__ import annotations

import atexit
import builtins
import gc
import importlib
import io
import json
import os
import runpy
import select
import shlex
import signal
import socket
import sys
import threading
import types
import weakref
from pathlib import Path

#: third-party libraries a run imports, heaviest first; mtft and deepspeed are left to the child
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
    # a run's report draws with matplotlib (~1 s of imports, its colormaps most); pyplot is left to the child, which
    # chooses its backend first (matplotlib.use("Agg")), as a fresh interpreter does
    "matplotlib",
    "matplotlib.figure",
    "matplotlib.image",
    "matplotlib.backend_bases",
    # the run's config schema (mtft.config) and DeepSpeed's config are pydantic models: pydantic's package imports its
    # parts lazily, so they are named (~0.5 s of every launch and every rank); DeepSpeed's own light dependencies too.
    # DeepSpeed itself stays out (above)
    "pydantic.main",
    "pydantic.fields",
    "pydantic.functional_validators",
    "pydantic.functional_serializers",
    "pydantic.types",
    "pydantic.config",
    "pydantic.type_adapter",
    "hjson",
    "einops",
    "msgpack",
    # a ZeRO engine's optimizer check imports DeepSpeed's Muon optimizer, whose torch.compile decorators import
    # torch's inductor (~1.2 s of every ZeRO launch and rank); torch's own module, nothing of DeepSpeed's
    "torch._inductor.compile_fx",
)
#: the sys.path entries the server's own PYTHONPATH added: a child gets its own environment's instead
_SERVER_PYTHONPATH = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]


def write_client(path: str, server: str) -> None:
    """The executable a forked child sees as ``sys.executable``: a shell line that runs ``warm_client.py``, told this
    server's socket, with this interpreter and without site-packages (it imports only the standard library: a few
    milliseconds)."""
    client = Path(__file__).with_name("warm_client.py")
    command = shlex.join([sys.executable, "-I", "-S", str(client), server])
    Path(path).write_text(f'#!/bin/sh\nexec {command} "$@"\n')
    os.chmod(path, 0o755)


def serve(path: str) -> dict:
    """Accept launches forever; return only in a forked child, with the launch it must run. Each launch gets a
    reaper process (a child of the server) that forks the run, reports its pid, waits for it and reports its status,
    so that the server goes back to accepting at once and reaps nothing itself."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the reapers are reaped by the kernel
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    while True:
        connection, _ = listener.accept()
        if os.fork() == 0:  # the reaper
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # waitpid of its own child needs the default
            _, streams, _, _ = socket.recv_fds(connection, 1, 3)
            reader = connection.makefile("r", encoding="utf-8")
            request = json.loads(reader.readline())
            pid = os.fork()
            if pid == 0:  # the run
                reader.close()
                connection.close()
                request["streams"] = streams
                return request
            for fd in streams:
                os.close(fd)
            connection.sendall((json.dumps({"pid": pid}) + "\n").encode())
            status = _wait(pid, connection)
            try:
                connection.sendall((json.dumps({"status": status}) + "\n").encode())
            except OSError:
                pass  # the client is gone
            os._exit(0)
        connection.close()


def _wait(pid: int, connection: socket.socket) -> int:
    """Wait for the run to end; if the client goes away first, kill the run's process group (and the run)."""
    ended = os.pidfd_open(pid)
    while True:
        ready, _, _ = select.select([ended, connection], [], [])
        if ended in ready:
            break
        if not connection.recv(1):  # the client is gone: nothing waits for this run any more
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            break
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


#: the files the run opened (by ``open``), to flush the ones it left open when it ends (:func:`end`)
_OPENED: weakref.WeakSet = weakref.WeakSet()
_open = io.open


def _open_and_track(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
    opened = _open(*args, **kwargs)
    _OPENED.add(opened)
    return opened


def become(request: dict, client: str) -> None:
    """Turn this forked child into ``python SCRIPT ARGS`` (``-m MODULE``, ``-c CODE``) started in ``cwd`` with
    ``env`` and the client's standard streams."""
    os.setsid()  # a session of its own, as the tests' subprocesses and torchrun's ranks get
    for fd, stream in enumerate(request["streams"]):
        os.dup2(stream, fd)
        os.close(stream)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115
    if request.get("unbuffered"):  # python -u
        sys.stdout, sys.stderr = (
            io.TextIOWrapper(open(fd, "wb", buffering=0, closefd=False), write_through=True, line_buffering=True)  # noqa: SIM115
            for fd in (1, 2)
        )
    else:
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if "module" in request:
        sys.argv = [request["module"], *request["argv"]]  # runpy.run_module puts the module's file in argv[0]
        first = os.getcwd()  # as for python -m MODULE
    elif "code" in request:
        sys.argv = ["-c", *request["argv"]]
        first = ""  # as for python -c CODE
    else:
        sys.argv = [request["script"], *request["argv"]]
        first = os.path.dirname(os.path.abspath(request["script"]))  # as for python SCRIPT
    added = [entry for entry in request["env"].get("PYTHONPATH", "").split(os.pathsep) if entry]
    rest = [entry for entry in sys.path[1:] if entry not in _SERVER_PYTHONPATH]
    sys.path[:] = [first, *added, *rest]
    sys.executable = client  # what this run launches with sys.executable is forked warm too
    builtins.open = io.open = _open_and_track
    import torch

    torch.set_num_threads(int(request["threads"]))  # OMP_NUM_THREADS was read when torch was loaded here


def _end_with_the_test_process() -> None:
    """SIGKILL this server when the test process that started it dies, however it dies (Linux's parent-death
    signal): a server left behind would hold its imports' memory for nothing. The runs the test process launched go
    too: each one's reaper sees its connection to the test process close and kills it."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def main() -> None:
    path, client = sys.argv[1:3]
    _end_with_the_test_process()
    write_client(client, path)
    for name in PRELOAD:
        importlib.import_module(name)
    gc.freeze()  # the children's collections skip what the server made: no copy-on-write of its pages by the GC
    request = serve(path)
    become(request, client)
    try:
        if "module" in request:
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        elif "code" in request:
            program = types.ModuleType("__main__")  # python -c runs CODE in a fresh __main__
            sys.modules["__main__"] = program
            exec(compile(request["code"], "<string>", "exec"), program.__dict__)
        else:
            runpy.run_path(os.path.abspath(request["script"]), run_name="__main__")
    except SystemExit as stop:
        end(_exit_status(stop))
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        end(-signal.SIGINT)  # as the interpreter does: it ends by SIGINT
    except BaseException:
        sys.excepthook(*sys.exc_info())
        end(1)
    end(0)


def _exit_status(stop: SystemExit) -> int:
    """The exit status the interpreter gives ``SystemExit(code)``: None 0, an int itself, anything else printed to
    stderr and 1."""
    if stop.code is None:
        return 0
    if isinstance(stop.code, int):
        return stop.code
    print(stop.code, file=sys.stderr)
    return 1


def end(status: int) -> None:
    """End as the interpreter ends (Py_FinalizeEx): wait for the non-daemon threads, run the atexit handlers, flush
    the standard streams and every file left open, exit. What the interpreter does after that (tearing down every
    module, collecting every object) has no other effect outside the process, but in a fork it writes to each page
    of the server's heap it shares (the reference counts): 3 to 8 s per launch on this machine, as long as the
    imports it saves. So it is skipped."""
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr, *list(_OPENED)):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a file opened for reading
            pass
    if status < 0:
        if -status != signal.SIGKILL:  # whose handler cannot be set
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    os._exit(status & 0xFF)


if __name__ == "__main__":
    main()
