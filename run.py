"""mtft: fine-tune a multilingual encoder on many tasks and languages at once.

Launch recipes (one thread per process when several share a host):

    # one process (sets up its own single-process distributed environment)
    python run.py --config configs/demo.yaml

    # overrides, the resolved config, all options
    python run.py --config configs/demo.yaml training.max_steps=50 data.tasks.0.languages=[en,de]
    python run.py --config configs/demo.yaml --print-config
    python run.py --help

    # two processes on one machine
    OMP_NUM_THREADS=1 torchrun --nproc_per_node 2 run.py --config configs/demo.yaml \
        training.deepspeed_config=configs/deepspeed/zero2.json

    # several machines with the DeepSpeed launcher (passwordless ssh, pdsh); hostfile lines read "node1 slots=8",
    # and the slots set the processes per host; on one CPU machine see README.md "Launchers"
    deepspeed --hostfile hostfile run.py --config configs/demo.yaml \
        training.deepspeed_config=configs/deepspeed/zero2.json

    # continue an interrupted run from its latest complete checkpoint
    python run.py --config configs/demo.yaml --resume

    # download and cache a config's datasets (and Hub backbone) for later offline runs
    python run.py --config configs/xtreme_zero_shot.yaml --prefetch

    # other commands (python run.py <command> --help): see mtft/commands/__init__.py
    python run.py export --run runs/demo --out adapters/
"""

import sys

from mtft.cli import entry_point  # parsing, the commands, and one error line instead of a traceback

if __name__ == "__main__":
    entry_point(sys.argv[1:])
