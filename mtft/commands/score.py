"""``run.py score``: the official metrics of a predictions file, offline, as JSON.

The predictions file is what a run writes under ``predictions/<split>/<task>/<language>.jsonl``: one JSON
object per line, ``{"id": <example id>, "prediction": <label name | tag list | answer text | number>}``. The
references are the task's split for the language: from the Hub by default, or ``--references`` (a folder in
the Hub layout, or a .jsonl/.json/.csv/.parquet file with the dataset's columns), read through the same
loading, language selection and checks as training. Every reference needs exactly one prediction.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from mtft.core.errors import ConfigError, DataError, echo, shorten
from mtft.core.safe_yaml import load_yaml, read_text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="run.py score", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--task",
        required=True,
        metavar="TASK[/LANGUAGE]",
        help="task name, with the language unless the task has only one, e.g. tydiqa/sw",
    )
    parser.add_argument("--predictions", required=True, help="JSON-lines predictions file")
    parser.add_argument(
        "--references",
        default=None,
        help="the reference dataset: a Hub-layout folder or a data file (default: the task's Hub dataset)",
    )
    parser.add_argument("--split", default="validation", help="the task's split to score against (default: validation)")
    parser.add_argument(
        "--task-dir",
        action="append",
        default=[],
        metavar="DIR",
        help="extra folder of task definitions (as data.task_dirs); repeatable",
    )
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a task setting, e.g. offset_mismatch=fail; repeatable",
    )
    parser.add_argument("--cache-dir", default=None, help="datasets cache folder (default: the datasets default)")
    return parser


def main(args: argparse.Namespace) -> int:
    import datasets

    from mtft.data.pipeline import load_task_split
    from mtft.evaluation.scoring import score
    from mtft.tasks import discover_tasks, get_task

    datasets.disable_progress_bars()
    name, _, language = args.task.partition("/")
    task = get_task(name, discover_tasks(args.task_dir)).configured(_settings(args.setting), "run.py score --setting")
    language = _language(task, language)
    if args.split not in task.data:
        raise ConfigError(f"task {task.name!r} has no split {args.split!r}; valid: {', '.join(task.data)}")
    predictions_path = Path(args.predictions)
    predictions, rows = read_predictions(predictions_path, task.name)
    ref = task.dataset_ref(args.split, language, task.default_protocol)
    sources = {ref.path: args.references} if args.references else {}
    if args.references and not Path(args.references).exists():
        raise DataError(f"--references {args.references}: no such folder or file")
    raw, where = load_task_split(task, args.split, language, task.default_protocol, sources, args.cache_dir)
    label_names = task.resolve_label_names(raw)
    references = task.references(raw, label_names, where)
    metrics = score(task, predictions, references, label_names, str(predictions_path), rows)
    print(
        json.dumps(
            {
                "task": task.name,
                "language": language,
                "split": args.split,
                "references": where,
                "examples": len(references),
                "metric_variant": task.metric_description(),
                **metrics,
            },
            ensure_ascii=False,
            indent=1,
        )
    )
    return 0


def read_predictions(path: Path, task: str) -> tuple[dict[str, Any], dict[str, int]]:
    """id -> prediction and id -> line number, refusing malformed lines and duplicate ids (naming the line)."""
    predictions: dict[str, Any] = {}
    rows: dict[str, int] = {}
    lines = read_text(path, "predictions file", DataError).split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline
    for number, line in enumerate(lines, start=1):
        where = f"{path}: row {number}: task {task!r}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{where}: not a JSON object ({exc.msg})") from None
        if not isinstance(row, dict) or set(row) != {"id", "prediction"}:
            keys = sorted(row) if isinstance(row, dict) else type(row).__name__
            raise DataError(f'{where}: expected an object with exactly the keys "id" and "prediction", got {keys}')
        key = row["id"]
        if isinstance(key, int) and not isinstance(key, bool):
            key = str(key)  # predict gives an integer id back as the input had it; the gold ids are strings
        if not isinstance(key, str):
            raise DataError(f"{where}: the id must be a string or an integer, got {echo(key)}")
        if key in predictions:
            raise DataError(f"{where}: duplicate id {echo(key)} (first on row {rows[key]})")
        predictions[key], rows[key] = row["prediction"], number
    if not predictions:
        raise DataError(f"{path}: task {task!r}: the predictions file is empty")
    return predictions, rows


def _language(task, language: str) -> str:
    if not language:
        if len(task.languages) == 1:
            return task.languages[0]
        raise ConfigError(
            f"--task {task.name}: name the language as {task.name}/<language>; valid: {', '.join(task.languages)}"
        )
    if language not in task.languages:
        raise ConfigError(f"task {task.name!r} has no language {language!r}; valid: {', '.join(task.languages)}")
    return language


def _settings(items: list[str]) -> dict[str, Any]:
    settings = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--setting {item!r}: expected KEY=VALUE")
        settings[key] = load_yaml(value, f"--setting {shorten(item)}") if value.strip() else None
    return settings
