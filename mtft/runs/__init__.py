"""A finished run folder, read back: its config with the task definitions it keeps, and its model rebuilt.

One rebuild for every reader of a run -- the run loader (:mod:`mtft.training.restore`), the leave-one-out
study (:mod:`mtft.study.loo`) and the export (:mod:`mtft.commands.export`) -- so that they cannot drift apart.
This layer sits below training, study and the commands, and imports none of them.
"""

from mtft.runs.config import TASKS_DIR, read_run_config
from mtft.runs.rebuild import ENCODER_DIR, plain_encoder, rebuild_model

__all__ = ["ENCODER_DIR", "TASKS_DIR", "plain_encoder", "read_run_config", "rebuild_model"]
