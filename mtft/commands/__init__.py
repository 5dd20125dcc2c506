"""Sub-commands of ``run.py`` besides training: ``python run.py <command> --help``.

Each entry names a module with ``build_parser() -> argparse.ArgumentParser`` and ``main(args) -> int``; modules
are imported only when their command runs, so ``run.py --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
from types import ModuleType

COMMANDS: dict[str, tuple[str, str]] = {
    # name: (module, one-line summary for run.py --help)
    "export": ("mtft.commands.export", "write each task's adapter as a standard PEFT LoRA directory"),
    "predict": ("mtft.commands.predict", "a trained run's predictions on new input (a file or dataset), any language"),
    "evaluate": ("mtft.commands.evaluate", "evaluate a finished run, without training, on other languages or data"),
    "score": ("mtft.commands.score", "official metrics of a predictions file, offline, as JSON"),
    "study": ("mtft.commands.study", "a grid of runs over seeds, here or on Slurm, aggregated into tables and plots"),
    "probe": ("mtft.commands.probe", "Gaussian sensitivity probe of checkpoints: ΔL_p per γ and language"),
}


def command_module(name: str) -> ModuleType:
    return importlib.import_module(COMMANDS[name][0])


def run_command(name: str, argv: list[str]) -> int:
    module = command_module(name)
    args = module.build_parser().parse_args(argv)
    return module.main(args)


def add_trust_plugins(parser: argparse.ArgumentParser) -> None:
    """``--trust-plugins``, of every command that reads a run folder (mtft.core.registry.plugin_code)."""
    parser.add_argument(
        "--trust-plugins",
        action="store_true",
        help="import plug-in code (module:Class) that a run's config names; off: refused, no code imported",
    )
