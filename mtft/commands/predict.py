"""``run.py predict --run DIR --task T --input FILE|HUB_ID --out FILE``: a trained run's predictions on new input.

The input is a .jsonl/.json/.csv/.parquet file with the task's input columns (labels and ids optional), or a Hub
dataset id or local dataset folder read like the task's own data (``--split``, and the task's config for
``--language``). The output is JSON lines, one object per example in input order: ``id``, ``prediction`` -- the
label name, the BIO tags (one per word), the answer text, the choice's name or the number, as a run's
``predictions/`` files hold them (``run.py score`` scores it) -- and ``probabilities`` (classification, multiple
choice) or ``entities`` (token classification: word spans, end exclusive). ``--language`` may be any language,
one the run never trained on included; it names the config of a Hub dataset and routes adapters kept per
(task, language) objective. Each row keeps the input's own id (its id column, else the row number) and is
answered as its own. Rows are predicted and written a chunk at a time (memory does not grow with the input).

``--out`` follows mtft's output policy (:mod:`mtft.core.output`): never the input, never inside a run folder,
never through a symbolic link, an existing file only with ``--overwrite``; the file appears whole or not at all.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mtft.commands import add_trust_plugins
from mtft.config.run_config import RunConfig
from mtft.core.errors import CheckpointError, ConfigError, UserError
from mtft.core.registry import plugin_code
from mtft.runs import read_run_config
from mtft.training.restore import CHECKPOINT_HELP, RUN_CONFIG, find_run_dir


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="run.py predict", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--run", required=True, type=Path, help="the run directory (run.output_dir)")
    parser.add_argument("--task", required=True, help="one of the run's tasks")
    parser.add_argument("--input", required=True, help="a .jsonl/.json/.csv/.parquet file, a Hub id or dataset folder")
    parser.add_argument("--out", required=True, type=Path, help="the JSON-lines file to write (a new file)")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    parser.add_argument("--language", default=None, help="the input's language (any; default: none named)")
    parser.add_argument("--split", default="test", help="the split of a Hub id or dataset folder (default: test)")
    parser.add_argument("--checkpoint", default=None, help=CHECKPOINT_HELP)
    parser.add_argument("--batch-size", type=int, default=None, help="default: the run's evaluation.batch_size")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_trust_plugins(parser)
    return parser


def main(args: argparse.Namespace) -> int:
    with plugin_code(args.trust_plugins, RUN_CONFIG):
        return _predict(args)


def _predict(args: argparse.Namespace) -> int:
    import datasets

    from mtft.api.run import load_run, output_policy, read_input

    config = run_config(args.run)  # a folder that is not a run: refused before anything loads
    policy = output_policy(args.run, inputs=[args.input])
    policy.check_file(args.out, args.overwrite)
    if args.batch_size is not None and args.batch_size < 1:
        raise ConfigError(f"--batch-size {args.batch_size}: must be at least 1")
    datasets.disable_progress_bars()
    # an unknown task or input columns that do not fit it are refused before the model loads
    dataset, where = read_input(config, args.task, args.input, args.split, args.language)
    run = load_run(args.run, args.checkpoint, args.trust_plugins)
    count = 0
    with policy.writing_file(args.out, args.overwrite) as handle:
        for row in run.iter_predict(args.task, dataset, args.language, args.batch_size, not args.no_progress, where):
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
            count += 1
    print(f"{count} predictions of {args.task} -> {args.out}")
    return 0


def run_config(run: Path) -> RunConfig:
    """The config of the run in ``run`` (or of the run above a checkpoint folder)."""
    run_dir, _ = find_run_dir(run)
    try:
        return read_run_config(run_dir)
    except UserError as error:
        raise CheckpointError(f"{run_dir}/config.yaml: {error}") from None
