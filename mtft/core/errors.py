"""User-facing errors.

Anything the user can fix (a config, a data file, a CLI flag, a checkpoint) raises a subclass of
:class:`UserError`. ``run.py`` prints it as one line and exits with status 2 -- no stack trace -- while
genuine bugs still surface as ordinary exceptions with their traceback. A message echoes a user's value through
:func:`echo`, which bounds it: a 1 KB config can hold a value that prints as megabytes.
"""

from typing import Any

#: the most of a user's value an error message echoes
MAX_ECHO = 200


def echo(value: Any) -> str:
    """``repr(value)`` on one line, cut to :data:`MAX_ECHO` characters."""
    return shorten(repr(value))


def shorten(text: str) -> str:
    """``text`` on one line, cut to :data:`MAX_ECHO` characters (saying how long it was)."""
    text = " ".join(str(text).split())
    return text if len(text) <= MAX_ECHO else f"{text[:MAX_ECHO]}... ({len(text)} characters)"


class UserError(Exception):
    """A problem in the user's input, reported as one clear line."""


class ConfigError(UserError):
    """The run configuration is missing, malformed or invalid."""


class DataError(UserError):
    """A dataset, data file or row cannot be used."""


class CheckpointError(UserError):
    """A checkpoint or run directory cannot be used."""


class Interrupted(UserError):
    """SIGTERM or Ctrl-C stopped a run after a checkpoint was saved; ``run.py`` exits with ``exit_code``
    (128 + the signal's number, as a shell reports a process the signal ended: 143 for SIGTERM, 130 for SIGINT)."""

    resume_flag = True  # the command continues with --resume added (a study continues by the same command)
    continue_in: str | None = None  # set: the printed command first changes to this folder (works from anywhere)

    def __init__(self, signal_name: str, step: int, checkpoint, message: str = ""):
        self.signal_name, self.step, self.checkpoint = signal_name, step, checkpoint
        self.exit_code = {"SIGINT": 130, "SIGTERM": 143}.get(signal_name, 143)
        super().__init__(message or f"stopped by {signal_name} after step {step}; checkpoint {checkpoint} saved")


class Diverged(UserError):
    """Training produced a non-finite loss. The run stops there: the weights are lost, nothing after the last
    checkpoint is saved, and the run is not complete (a study counts it as failed, with this line)."""


class DiskFullError(UserError):
    """A write ran out of space; nothing half-written looks complete."""
