"""Sub-commands of ``run.py`` besides training: ``python run.py <command> --help``.

Each is a :class:`Command` enrolled in :data:`COMMANDS` (a :class:`mtft.core.registry.Registry`, as every plug-in
kind) by a loader that imports its module -- ``build_parser() -> argparse.ArgumentParser`` and ``main(args) -> int``
-- only when the command runs, so that ``run.py --help`` stays fast; the line beside it is its summary there.
"""

from __future__ import annotations

import argparse
from types import ModuleType
from typing import ClassVar

from mtft.core.registry import Registry


class Command:
    """A sub-command: the parser of its arguments and its main function (those of its module)."""

    name: ClassVar[str]
    module: ClassVar[ModuleType]

    @classmethod
    def build_parser(cls) -> argparse.ArgumentParser:
        return cls.module.build_parser()

    @classmethod
    def main(cls, args: argparse.Namespace) -> int:
        return cls.module.main(args)


def command(name: str, module: ModuleType) -> type[Command]:
    """The :class:`Command` of ``module`` (one with ``build_parser`` and ``main``), named ``name``."""
    return type(f"{name.title()}Command", (Command,), {"name": name, "module": module, "__module__": module.__name__})


COMMANDS: Registry[Command] = Registry("command", Command, by_path=False)


@COMMANDS.lazy("evaluate", about="evaluate a finished run, without training, on other languages or data")
def _evaluate() -> type:
    from mtft.commands import evaluate

    return command("evaluate", evaluate)


@COMMANDS.lazy("export", about="write each task's adapter as a standard PEFT LoRA directory")
def _export() -> type:
    from mtft.commands import export

    return command("export", export)


@COMMANDS.lazy("predict", about="a trained run's predictions on new input (a file or dataset), any language")
def _predict() -> type:
    from mtft.commands import predict

    return command("predict", predict)


@COMMANDS.lazy("probe", about="Gaussian sensitivity probe of checkpoints: ΔL_p per γ and language")
def _probe() -> type:
    from mtft.commands import probe

    return command("probe", probe)


@COMMANDS.lazy("score", about="official metrics of a predictions file, offline, as JSON")
def _score() -> type:
    from mtft.commands import score

    return command("score", score)


@COMMANDS.lazy("study", about="a grid of runs over seeds, here or on Slurm, aggregated into tables and plots")
def _study() -> type:
    from mtft.commands import study

    return command("study", study)


def run_command(name: str, argv: list[str]) -> int:
    cls = COMMANDS.get(name)
    return cls.main(cls.build_parser().parse_args(argv))


def add_trust_plugins(parser: argparse.ArgumentParser) -> None:
    """``--trust-plugins``, of every command that reads a run folder (mtft.core.registry.plugin_code)."""
    parser.add_argument(
        "--trust-plugins",
        action="store_true",
        help="import plug-in code (module:Class) that a run's config names; off: refused, no code imported",
    )
