"""``run.py evaluate --run DIR --out DIR [key.sub=value ...]``: evaluate a finished run without training.

The run's model (``--checkpoint``: best by default) on what its config, with ``data.*`` and ``evaluation.*``
overrides, says to evaluate: other languages (``data.tasks.0.languages=[en,sw,fr]``), another split
(``evaluation.split=test``), other data (``data.sources.<hub id>=<folder or file pattern>``) or more examples
(``data.tasks.0.max_eval_examples=null``). The metrics, prediction files and report are those of a run's own
evaluation, written to ``--out`` (new or empty, never inside the run folder): ``metrics.json``,
``predictions/<split>/<task>/<language>.jsonl``, ``report.md`` and the ``config.yaml`` evaluated.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mtft.commands import add_trust_plugins
from mtft.core.registry import plugin_code
from mtft.training.restore import CHECKPOINT_HELP, RUN_CONFIG


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="run.py evaluate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--run", required=True, type=Path, help="the run directory (run.output_dir)")
    parser.add_argument("--out", required=True, type=Path, help="a new (or empty) folder for the evaluation")
    parser.add_argument("--checkpoint", default=None, help=CHECKPOINT_HELP)
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value", help="data.* and evaluation.* overrides")
    add_trust_plugins(parser)
    return parser


def main(args: argparse.Namespace) -> int:
    from mtft.api.evaluate import evaluate_run, evaluation_config
    from mtft.api.run import output_policy

    with plugin_code(args.trust_plugins, RUN_CONFIG):
        evaluation_config(args.run, args.overrides)  # a bad override or a folder that is not a run: before loading
    output_policy(args.run).check_folder(args.out)
    result = evaluate_run(args.run, args.out, args.overrides, args.checkpoint, args.trust_plugins)
    summary = ", ".join(f"{k}={v:.4f}" for k, v in result.metrics.items() if k.count("/") == 1 and "majority" not in k)
    print(f"{summary}\n-> {args.out}")
    return 0
