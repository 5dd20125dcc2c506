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


def main() -> None:
    server, args = sys.argv[1], sys.argv[2:]
    request = parse(args)
    threads = os.environ.get("OMP_NUM_THREADS", "")
    cold = request is None or request.get("module") in COLD_MODULES
    if cold or not threads.isdigit() or not os.path.exists(server):
        os.execv(sys.executable, [sys.executable, *args])
    request.update(env=dict(os.environ), cwd=os.getcwd(), threads=int(threads))
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.connect(server)
    socket.send_fds(connection, [b"F"], [0, 1, 2])
    connection.sendall((json.dumps(request) + "\n").encode())
    answers = connection.makefile("r", encoding="utf-8")
    pid = json.loads(answers.readline())["pid"]
    for forwarded in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(forwarded, lambda number, _frame: os.kill(pid, number))
    answer = answers.readline()
    if not answer:
        sys.exit(f"warm_client: the warm Python's reaper of {args} died")
    status = json.loads(answer)["status"]
    if status < 0:  # killed by a signal: end the same way
        if -status != signal.SIGKILL:  # whose handler cannot be set
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    sys.exit(status)


if __name__ == "__main__":
    main()
