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
from mtft.config.run_config import RunConfig
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
    except KeyboardInterrupt:  # Ctrl-C outside the training loop (data, the model, a conversion, a command)
        if speaks_for_node():
            print("error: stopped by Ctrl-C; nothing half-written is kept: run the same command again", file=sys.stderr)
        sys.exit(130)


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


def console() -> None:
    """The ``mtft`` command an installed mtft puts on the PATH: ``mtft train --config X`` (``python run.py
    --config X``), ``mtft predict|evaluate|export|score|probe|study ...``."""
    entry_point(sys.argv[1:], prog="mtft")


def main(argv: list[str]) -> int:
    if argv and argv[0] == "train":  # the console script's spelling of run.py's training form
        argv = argv[1:]
    if argv and argv[0] in COMMANDS:
        return run_command(argv[0], argv[1:])
    if argv and not argv[0].startswith("-") and "=" not in argv[0]:  # not an option, not an override
        raise ConfigError(
            f"unknown command {shorten(argv[0])!r}; commands: {', '.join(COMMANDS)}, "
            "or train with run.py --config <file> [key.sub=value ...] (installed: mtft train --config <file>)"
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
        from mtft.data.prefetch import prefetch_backbone, prefetch_datasets

        prefetch_datasets(config.data, config.evaluation.split)
        prefetch_backbone(config.model, config.data.longest_row, config.pretrain.seed)
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


def sections_help() -> str:
    """The config's sections, a line each: what ``run.py --help`` ends with."""
    lines = textwrap.wrap(
        "config sections (set in the YAML file or as key.sub=value on the command line; run.py --help SECTION lists "
        "a section's keys, e.g. --help training or --help forgetting.probe, and --help all every key):",
        width=100,
    )
    width = max(map(len, RunConfig.model_fields))
    for name, field in RunConfig.model_fields.items():
        lines += textwrap.wrap(
            f"{name:{width}s}  {field.description}",
            width=100,
            initial_indent="  ",
            subsequent_indent=" " * (width + 4),
        )
    return "\n".join(lines)


def options_help(prefix: str) -> str:
    """Every config key under the dotted ``prefix`` (``all``: every key) with its type, default and description."""
    options = [
        option
        for option in iter_options()
        if prefix == "all" or option[0] == prefix or option[0].startswith(f"{prefix}.")
    ]
    if not options:
        raise ConfigError(
            f"--help {shorten(prefix)!r}: no config key is under it; the sections: {', '.join(RunConfig.model_fields)}"
            ", or all"
        )
    lines = [f"config keys under {prefix}:" if prefix != "all" else "config keys:"]
    for key, kind, default, description in options:
        lines.append(f"  {key}  [{kind}, default: {default}]")
        lines += textwrap.wrap(description, width=96, initial_indent="      ", subsequent_indent="      ")
    return "\n".join(lines)


class _HelpAction(argparse.Action):
    """``-h/--help [SECTION]``: the command line and the config's sections, or (with SECTION) the keys under it, so
    that the reference of a few hundred keys is read a section at a time."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest, nargs="?", const=None, default=default, metavar="SECTION", help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(options_help(values) if values else parser.format_help().rstrip("\n"))
        parser.exit()


def train_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="run.py",
        description="Multilingual multi-task fine-tuning with DeepSpeed (installed: mtft train --config ...).\n\n"
        "other commands (run.py <command> --help; installed: mtft <command>):\n"
        + "\n".join(f"  {name:8s} {COMMANDS.about(name)}" for name in COMMANDS),
        epilog=sections_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False,
    )
    parser.add_argument(
        "-h", "--help", action=_HelpAction, help="show this help, or with SECTION the config keys under it, and exit"
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
