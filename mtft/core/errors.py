"""User-facing errors.

Anything the user can fix (a config, a data file, a CLI flag, a checkpoint) raises a subclass of
:class:`UserError`. ``run.py`` prints it as one line and exits with status 2 -- no stack trace -- while
genuine bugs still surface as ordinary exceptions with their traceback.
"""


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

    def __init__(self, signal_name: str, step: int, checkpoint):
        self.signal_name, self.step, self.checkpoint = signal_name, step, checkpoint
        self.exit_code = {"SIGINT": 130, "SIGTERM": 143}.get(signal_name, 143)
        super().__init__(f"stopped by {signal_name} after step {step}; checkpoint {checkpoint} saved")


class DiskFullError(UserError):
    """A write ran out of space; nothing half-written looks complete."""
