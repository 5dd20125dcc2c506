"""``python run.py ARGS`` inside the test process: what an end-to-end test runs when a process of its own is not what
it tests (tests/helpers/launch.py's :func:`~tests.helpers.launch.run_cli`).

A run is a call of ``mtft.cli.entry_point`` with what a fresh process would have had of the process-wide state: the
environment, ``sys.argv``, the working directory, torch's threads, the interpreter's warning filters, the console
streams (captured, and returned as a ``CompletedProcess``'s), and the exit status that ``sys.exit`` would have
ended the process with. What a run leaves in the process is taken back after it, so that the next test starts from
the same state: the environment and the rest above, the SIGINT/SIGTERM handlers, the ``mtft`` logger's handlers, the
W&B service a run's tracker starts, and the one-process group a run sets up (``mtft.core.distributed.
init_distributed``) -- the forked gloo ranks of :func:`~tests.helpers.launch.run_ranks` refuse a test process that
has one.

What stays is what a library is allowed to keep in memory: imported modules, caches of pure functions, DeepSpeed's
accelerator. A test where the process itself is the point (signals, exit by a signal, several processes, a
launcher, a study's jobs, an installed console script) launches one instead (:func:`~tests.helpers.launch.launch_cli`).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import signal
import subprocess
import sys
import traceback
import warnings
from collections.abc import Iterator
from pathlib import Path

#: the filters a fresh interpreter starts with (Python 3.11's ``warnings`` documentation, "Default Warning
#: Filter"), in order of precedence: pytest's own filters and recording are not what a user's process sees
_INTERPRETER_FILTERS = (
    ("default", DeprecationWarning, "__main__"),
    ("ignore", DeprecationWarning, ""),
    ("ignore", PendingDeprecationWarning, ""),
    ("ignore", ImportWarning, ""),
    ("ignore", ResourceWarning, ""),
)


def run_in_process(args: list[str], env: dict[str, str], threads: int, cwd: Path) -> subprocess.CompletedProcess:
    """``python run.py ARGS`` with environment ``env`` in ``cwd`` and ``threads`` torch threads, in this process."""
    from mtft.cli import entry_point

    stdout, stderr = io.StringIO(), io.StringIO()
    with _as_a_fresh_process(["run.py", *args], env, threads, cwd), _console(stdout, stderr):
        status = _status(entry_point, args)
    return subprocess.CompletedProcess(["run.py", *args], status, stdout.getvalue(), stderr.getvalue())


def _status(entry_point, args: list[str]) -> int:  # noqa: ANN001
    """The exit status of ``entry_point(args)`` as the interpreter would end with it: ``sys.exit``'s code (a text
    is printed and means 1), 1 and the traceback on stderr for an exception mtft let through."""
    try:
        entry_point(args)
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        print(stop.code, file=sys.stderr)
        return 1
    except Exception:  # noqa: BLE001 -- what the interpreter does with it: print it, end with 1
        traceback.print_exc()
        return 1
    return 0


@contextlib.contextmanager
def _as_a_fresh_process(argv: list[str], env: dict[str, str], threads: int, cwd: Path) -> Iterator[None]:
    import torch

    saved_env, saved_argv, saved_cwd, saved_threads = dict(os.environ), sys.argv, os.getcwd(), torch.get_num_threads()
    saved_signals = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    mtft_log, root_log = logging.getLogger("mtft"), logging.getLogger()
    saved_handlers, saved_level, saved_propagate = list(mtft_log.handlers), mtft_log.level, mtft_log.propagate
    saved_root_handlers = list(root_log.handlers)  # pytest's: a fresh process has none, and logs a warning that
    root_log.handlers.clear()  # reaches the root on stderr (logging.lastResort)
    saved_bars = _progress_bars()
    registries = _registries()
    saved_registries = [registry.snapshot() for registry in registries]  # a run's plug-ins enrol themselves
    saved_modules = set(sys.modules)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = argv
    os.chdir(cwd)
    torch.set_num_threads(threads)
    try:
        with warnings.catch_warnings():
            warnings.resetwarnings()
            for action, category, module in reversed(_INTERPRETER_FILTERS):
                warnings.filterwarnings(action, category=category, module=module)
            warnings.showwarning = _show_warning
            yield
    finally:
        _end_process_group()
        _end_wandb_service()
        for handler in [h for h in mtft_log.handlers if h not in saved_handlers]:
            mtft_log.removeHandler(handler)
            handler.close()
        mtft_log.setLevel(saved_level)
        mtft_log.propagate = saved_propagate
        root_log.handlers[:] = saved_root_handlers
        _set_progress_bars(saved_bars)
        for registry, saved in zip(registries, saved_registries):
            registry.restore(saved)
        for name in [name for name in sys.modules if name not in saved_modules and name.startswith("mtft_user_")]:
            del sys.modules[name]  # the run's plug-in modules (mtft.tasks.declarative names them)
        for sig, handler in saved_signals.items():
            signal.signal(sig, handler)
        torch.set_num_threads(saved_threads)
        os.chdir(saved_cwd)
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)


def _registries() -> list:
    """mtft's plug-in registries (mtft.core.registry), one per plug-in kind."""
    from mtft.adapters.registry import METHODS
    from mtft.commands import COMMANDS
    from mtft.study.analyses import REGISTRY as ANALYSES
    from mtft.tasks.kinds import HEAD_CLASSES, TASK_CLASSES
    from mtft.weighting.registry import WEIGHTINGS

    return [METHODS, COMMANDS, ANALYSES, HEAD_CLASSES, TASK_CLASSES, WEIGHTINGS]


def _progress_bars() -> tuple[bool, bool, int]:
    """Whether datasets' and transformers' progress bars are on, and transformers' verbosity: settings of the
    process that a run changes for its own console (``mtft.training.pretrain.quiet_progress``)."""
    import datasets
    import transformers

    logging_ = transformers.utils.logging
    return not datasets.are_progress_bars_disabled(), logging_.is_progress_bar_enabled(), logging_.get_verbosity()


def _set_progress_bars(saved: tuple[bool, bool, int]) -> None:
    import datasets
    import transformers

    datasets_on, transformers_on, verbosity = saved
    (datasets.enable_progress_bars if datasets_on else datasets.disable_progress_bars)()
    logging_ = transformers.utils.logging
    (logging_.enable_progress_bar if transformers_on else logging_.disable_progress_bar)()
    logging_.set_verbosity(verbosity)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001
    """The interpreter's way of showing a warning -- on the current ``sys.stderr`` -- where pytest records them."""
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def _end_process_group() -> None:
    """Destroy the one-process group the run set up, and forget the groups DeepSpeed made from it: it keeps them in
    ``deepspeed.utils.groups``' globals (the world group's clone, the data-parallel group, ...), which would hand
    the next run's engine a destroyed group. A process ends with its group; this is the one thing an in-process run
    needs that mtft, which sets a group up once per process and reuses it, does not do."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    dist.destroy_process_group()
    groups = sys.modules.get("deepspeed.utils.groups")
    for name, value in vars(groups).items() if groups is not None else ():
        if isinstance(value, dist.ProcessGroup):
            setattr(groups, name, None)
        elif isinstance(value, dict) and any(isinstance(group, dist.ProcessGroup) for group in value.values()):
            value.clear()


def _end_wandb_service() -> None:
    """Stop the W&B service a run with ``logging.report_to: wandb`` started (with the environment the run had: its
    ``WANDB_MODE``). A process ends with it; in the test process it would outlive the run to the worker's exit, where
    its ``atexit`` teardown finds the service gone and prints a traceback into the suite's output."""
    wandb = sys.modules.get("wandb")
    if wandb is not None:
        wandb.teardown()


@contextlib.contextmanager
def _console(stdout: io.StringIO, stderr: io.StringIO) -> Iterator[None]:
    """``sys.stdout``/``sys.stderr`` into ``stdout``/``stderr``, and transformers' log handler with them: it holds
    the stream that was ``sys.stderr`` when transformers first logged."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.get_logger("transformers")  # creates its one handler if no one has logged yet
    handler = transformers_logging._default_handler  # noqa: SLF001
    saved = handler.stream if handler is not None else None
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        if handler is not None:
            handler.setStream(stderr)
        try:
            yield
        finally:
            if handler is not None:
                handler.setStream(saved)
