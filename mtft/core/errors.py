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
