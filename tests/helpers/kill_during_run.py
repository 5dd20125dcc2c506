"""Run ``run.py`` but SIGKILL the process at a chosen point of checkpointing, as a crash would.

python tests/helpers/kill_during_run.py after 20 --config ...    # right after checkpoint 20 is complete
python tests/helpers/kill_during_run.py during 20 --config ...   # while writing checkpoint 20
"""

import os
import runpy
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from mtft.training import checkpoint  # noqa: E402

mode, kill_step = sys.argv[1], int(sys.argv[2])
sys.argv = ["run.py", *sys.argv[3:]]
save_checkpoint, write_weights = checkpoint.save_checkpoint, checkpoint.write_weights


def write_then_die(*args, **kwargs):
    write_weights(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGKILL)  # weights written, marker and rename not yet done


def patched_save(engine, run_dir, step, *args, **kwargs):
    if mode == "during" and step == kill_step:
        checkpoint.write_weights = write_then_die
    path = save_checkpoint(engine, run_dir, step, *args, **kwargs)
    if mode == "after" and step == kill_step:
        os.kill(os.getpid(), signal.SIGKILL)
    return path


checkpoint.save_checkpoint = patched_save
runpy.run_path("run.py", run_name="__main__")
