"""Run ``run.py`` and send this process a signal in the middle of a training step, as ``kill`` or Ctrl-C would.

    python tests/helpers/signal_during_run.py SIGTERM 3 --config ...   # while drawing step 3's batch

The signal goes through the operating system (``os.kill``) to the real process; the batch draw is only the
deterministic moment to send it.
"""

import os
import runpy
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from mtft.data.batching import BatchBuilder  # noqa: E402

name, at_batch = sys.argv[1], int(sys.argv[2])
sys.argv = ["run.py", *sys.argv[3:]]
train_batch, calls = BatchBuilder.train_batch, [0]


def signalling_batch(self, *args, **kwargs):
    calls[0] += 1
    if calls[0] == at_batch:
        os.kill(os.getpid(), getattr(signal, name))
    return train_batch(self, *args, **kwargs)


BatchBuilder.train_batch = signalling_batch
runpy.run_path("run.py", run_name="__main__")
