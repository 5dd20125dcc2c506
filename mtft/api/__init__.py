"""Using what a run learnt, from Python: load a finished run and predict on new text, in any language.

    from mtft.api import load_run

    run = load_run("runs/demo")  # its best checkpoint
    run.predict("xnli", [{"premise": "Der Hund schläft.", "hypothesis": "Ein Tier ruht."}], language="de")

``run.py predict`` and ``run.py evaluate`` are built on this module (see README.md, "Using a trained run").
"""

from mtft.api.run import TrainedRun, load_run

__all__ = ["TrainedRun", "load_run"]
