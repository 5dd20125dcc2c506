"""The command line of ``run.py`` (and ``python -m mtft``, which study jobs launch): ``--config``, ``key.sub=value``
overrides, ``--help`` from the schema, the sub-commands, and the one place that turns a user error into one line."""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys
import textwrap
import time
from pathlib import Path

from mtft.commands import COMMANDS, run_command
from mtft.config import config_to_yaml, load_config
from mtft.config.load import iter_options
from mtft.core.distributed import report_to_launcher, speaks_for_node
from mtft.core.errors import ConfigError, Interrupted, UserError, shorten


def entry_point(argv: list[str], prog: str = "python run.py") -> None:
    """Run ``argv`` and exit: 0, 2 with one ``error:`` line for a user error, 143 / 130 after SIGTERM / Ctrl-C
    (like a process the signal ended) with the command that resumes. Under a launcher the line is printed once
    per node, by its first process (every process exits with the same status)."""
    try:
        sys.exit(main(argv))
    except Interrupted as stop:  # a checkpoint was saved
        _error(stop, f"{stop}; continue with: {_resume_command(prog, argv, stop.resume_flag, stop.continue_in)}")
        sys.exit(stop.exit_code)
    except UserError as error:
        _error(error, str(error))
        sys.exit(2)


#: how long a process that keeps a user error off the console waits before it exits: the launcher stops every
#: process once the first has exited, so the first process of the node must have printed the line by then
QUIET_EXIT_DELAY_S = 5.0


def _error(error: UserError, text: str) -> None:
    """``error: <text>`` on the console from the node's first process; the others hand it to torchrun's report and
    exit a moment later (the launcher ends them sooner once the first process has printed and exited)."""
    if speaks_for_node():
        print(f"error: {text}", file=sys.stderr)
    else:
        report_to_launcher(f"{type(error).__name__}: {text}")
        time.sleep(QUIET_EXIT_DELAY_S)


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
    if args.plan:
        from mtft.data.plan import describe_plan

        print("\n".join(describe_plan(config.data, config.evaluation, config.model.backbone)))
        return 0
    if args.prefetch:
        from mtft.data.prefetch import prefetch

        prefetch(config)
        return 0
    with _locked(config.run.output_dir):  # a pre-training run's directory as a fine-tuning run's
        if config.run.stage == "pretrain":
            from mtft.training.pretrain import PretrainRun

            PretrainRun(config).execute()
            return 0
        from mtft.training.trainer import Run  # heavy imports only when training

        Run(config).execute()
    return 0


def _locked(output_dir: str):
    """The run directory's lock (mtft.core.runlock), taken by the first process only: the other processes of a
    torchrun launch share its directory, and torchrun stops them when the first exits refused."""
    from mtft.core.runlock import run_lock

    return run_lock(output_dir) if os.environ.get("RANK", "0") == "0" else contextlib.nullcontext()


def _resume_command(prog: str, argv: list[str], resume_flag: bool, continue_in: str | None = None) -> str:
    """The command that continues; with ``continue_in`` (a study's working directory, against which its paths and
    its runs' data paths resolve) it first changes there and names the script as it was launched, so that it works
    from any folder."""
    if continue_in and prog == "python run.py" and Path(sys.argv[0]).name == "run.py":
        prog = f"python {shlex.quote(sys.argv[0])}"
    command = [*shlex.split(prog), *argv] + ([] if "--resume" in argv or not resume_flag else ["--resume"])
    text = " ".join(shlex.quote(part) for part in command)
    return f"cd {shlex.quote(continue_in)} && {text}" if continue_in else text


def options_help() -> str:
    lines = ["config keys (set in the YAML file or as key.sub=value on the command line):"]
    for key, kind, default, description in iter_options():
        lines.append(f"  {key}  [{kind}, default: {default}]")
        lines += textwrap.wrap(description, width=96, initial_indent="      ", subsequent_indent="      ")
    return "\n".join(lines)


def train_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="run.py",
        description="Multilingual multi-task fine-tuning with DeepSpeed.\n\nother commands (run.py <command> --help):\n"
        + "\n".join(f"  {name:8s} {COMMANDS.about(name)}" for name in COMMANDS),
        epilog=options_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", required=True, help="run config (YAML), e.g. configs/demo.yaml")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value", help="override config values")
    parser.add_argument("--print-config", action="store_true", help="print the fully resolved config and exit")
    parser.add_argument("--resume", action="store_true", help="same as run.resume=true")
    parser.add_argument(
        "--prefetch",
        action="store_true",
        help="download and cache the config's datasets (and Hub backbone) for offline runs, then exit",
    )
    parser.add_argument(
        "--plan",
        action="store_true",
        help="check the config's tasks and print what a run would train and evaluate on (sources, targets, dataset "
        "splits, model selection) without reading data, the model or the Hub, then exit",
    )
    # The deepspeed launcher appends --local_rank; LOCAL_RANK in the environment carries the same value.
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    return parser
