"""Command-line parsing for ``run.py``: ``--config``, ``key.sub=value`` overrides, ``--help`` from the schema."""

from __future__ import annotations

import argparse
import textwrap

from mtft.commands import COMMANDS
from mtft.config.load import iter_options


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
        + "\n".join(f"  {name:8s} {summary}" for name, (_, summary) in COMMANDS.items()),
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
    # The deepspeed launcher appends --local_rank; LOCAL_RANK in the environment carries the same value.
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    return parser
