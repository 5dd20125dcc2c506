"""``python run.py export --run <run dir> --out <dir>``: each task's adapter as a standard PEFT LoRA directory."""

from __future__ import annotations

import argparse
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="run.py export",
        description="Write each task's adapter of a multi_lora or lora run as a PEFT LoRA directory (load it with "
        "peft.PeftModel.from_pretrained on the base encoder), with the task head and its label names.",
    )
    parser.add_argument("--run", required=True, type=Path, help="the run directory (run.output_dir)")
    parser.add_argument("--out", required=True, type=Path, help="a new (or empty) directory to write into")
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help="checkpoint folder to export (default: the run's newest complete checkpoint; "
                        "<run>/best for the best one)")
    return parser


def main(args: argparse.Namespace) -> int:
    from mtft.adapters.export import export_run

    for folder in export_run(args.run, args.out, args.checkpoint):
        print(folder)
    return 0
