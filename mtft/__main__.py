"""``python -m mtft`` is ``python run.py``: the form a study job launches, which needs no checkout."""

import sys

from mtft.cli import entry_point

if __name__ == "__main__":
    entry_point(sys.argv[1:], prog="python -m mtft")
