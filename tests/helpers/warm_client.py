"""``sys.executable`` of a run forked by the warm Python (warm_python.py): hands ``python [-u] SCRIPT|-m MODULE|-c
CODE ARGS`` to the warm server, which forks it with this process's environment, working directory and standard
streams, and then stands for it: it forwards the signals it gets to the run (torchrun stops its ranks with SIGTERM,
a study its runs with SIGTERM or SIGINT), ends as the run ended (its exit code, or killed by the same signal), and,
killed itself, takes the run with it (the server kills a run whose client is gone). Any other command line, or one
without OMP_NUM_THREADS (a fresh interpreter picks its own thread count), or one that must run with this process's
own pid (:data:`COLD_MODULES`), is run by the real interpreter, unchanged.

    warm_client.py SERVER_SOCKET PYTHON_ARGS...
"""

import json
import os
import signal
import socket
import sys

#: programs that must run as this very process: submitit's local controller names its job by its own pid, which the
#: launching process knows as this client's
COLD_MODULES = ("submitit.local._local",)


def parse(args: list) -> dict | None:
    """The request for ``python ARGS``, or None when it is not one the server runs."""
    request: dict = {"unbuffered": False}
    while args and args[0] == "-u":
        request["unbuffered"], args = True, args[1:]
    if len(args) >= 2 and args[0] in ("-c", "-m"):
        request["code" if args[0] == "-c" else "module"] = args[1]
        request["argv"] = args[2:]
    elif args and not args[0].startswith("-"):
        request["script"], request["argv"] = args[0], args[1:]
    else:
        return None
    return request


def command_line(request: dict) -> str:
    """The launch as a command line names it: ``script args``, ``-m module args`` or ``-c ... args``."""
    head = request.get("script") or (f"-m {request['module']}" if request.get("module") else "-c ...")
    return " ".join([head, *map(str, request.get("argv", []))])


class Handover:
    """One run handed to the warm server -- the protocol both of its clients speak (this script, and the test
    process's ``WarmPython.run`` in tests/helpers/launch.py): the three standard streams as file descriptors
    (SCM_RIGHTS) with one byte, the request as a JSON line; the server answers the run's pid in a JSON line, then
    its status (the exit code, or minus the signal that killed it) once it has ended."""

    def __init__(self, server: str, request: dict, streams: list) -> None:
        self.request = request
        self.connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.connection.connect(server)
        socket.send_fds(self.connection, [b"F"], streams)
        self.connection.sendall((json.dumps(request) + "\n").encode())
        self.answers = self.connection.makefile("r", encoding="utf-8")
        self.pid: int = json.loads(self.answers.readline())["pid"]

    def status(self, timeout: float | None = None) -> int:
        """Wait (at most ``timeout`` seconds: ``TimeoutError``) for the run's end; its status."""
        self.connection.settimeout(timeout)
        answer = self.answers.readline()
        if not answer:
            raise RuntimeError(f"the warm Python's reaper of run {self.pid} ({command_line(self.request)}) died")
        return json.loads(answer)["status"]

    def close(self) -> None:
        self.answers.close()
        self.connection.close()


def main() -> None:
    server, args = sys.argv[1], sys.argv[2:]
    request = parse(args)
    threads = os.environ.get("OMP_NUM_THREADS", "")
    cold = request is None or request.get("module") in COLD_MODULES
    if cold or not threads.isdigit() or not os.path.exists(server):
        os.execv(sys.executable, [sys.executable, *args])
    request.update(env=dict(os.environ), cwd=os.getcwd(), threads=int(threads))
    run = Handover(server, request, [0, 1, 2])
    for forwarded in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(forwarded, lambda number, _frame: os.kill(run.pid, number))
    try:
        status = run.status()
    except RuntimeError as error:
        sys.exit(f"warm_client: {error}")
    if status < 0:  # killed by a signal: end the same way
        if -status != signal.SIGKILL:  # whose handler cannot be set
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    sys.exit(status)


if __name__ == "__main__":
    main()
