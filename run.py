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

    # several machines with the DeepSpeed launcher; hostfile lines read "node1 slots=8"
    deepspeed --hostfile hostfile --num_nodes 2 --num_gpus 8 run.py --config configs/xnli.yaml \
        training.deepspeed_config=configs/deepspeed/zero2.json

    # continue an interrupted run from its latest complete checkpoint
    python run.py --config configs/demo.yaml --resume

    # download and cache a config's datasets (and Hub backbone) for later offline runs
    python run.py --config configs/xtreme_zero_shot.yaml --prefetch

    # other commands (python run.py <command> --help): see mtft/commands/__init__.py
    python run.py export --run runs/demo --out adapters/
"""

import os
import shlex
import sys

from mtft.cli import train_parser
from mtft.commands import COMMANDS, run_command
from mtft.config import config_to_yaml, load_config
from mtft.core.errors import ConfigError, Interrupted, UserError, shorten


def main(argv: list[str]) -> int:
    if argv and argv[0] in COMMANDS:
        return run_command(argv[0], argv[1:])
    if argv and not argv[0].startswith("-") and "=" not in argv[0]:  # not an option, not an override
        raise ConfigError(
            f"unknown command {shorten(argv[0])!r}; commands: {', '.join(COMMANDS)}, "
            "or train with run.py --config <file> [key.sub=value ...]"
        )
    args = train_parser().parse_args(argv)
    overrides = args.overrides + (["run.resume=true"] if args.resume else [])
    config = load_config(args.config, overrides)
    if args.print_config:
        print(config_to_yaml(config), end="")
        return 0
    if args.prefetch:
        from mtft.data.prefetch import prefetch

        prefetch(config)
        return 0
    if config.run.stage == "pretrain":
        from mtft.training.pretrain import PretrainRun

        PretrainRun(config).execute()
        return 0
    from mtft.training.trainer import Run  # heavy imports only when training

    with _locked(config.run.output_dir):
        Run(config).execute()
    return 0


def _locked(output_dir: str):
    """The run directory's lock (mtft.core.runlock), taken by the first process only: the other processes of a
    torchrun launch share its directory, and torchrun stops them when the first exits refused."""
    import contextlib

    from mtft.core.runlock import run_lock

    return run_lock(output_dir) if os.environ.get("RANK", "0") == "0" else contextlib.nullcontext()


def _resume_command(argv: list[str]) -> str:
    command = ["python", "run.py", *argv] + ([] if "--resume" in argv else ["--resume"])
    return " ".join(shlex.quote(part) for part in command)


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Interrupted as stop:  # SIGTERM / Ctrl-C: a checkpoint was saved; 143 / 130 like a process the signal ended
        print(f"error: {stop}; continue with: {_resume_command(sys.argv[1:])}", file=sys.stderr)
        sys.exit(stop.exit_code)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
