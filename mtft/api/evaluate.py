"""Evaluate a finished run without training: its model on other languages, splits, data or sources.

The run's config is read with ``data.*`` and ``evaluation.*`` overrides (what is evaluated, never what was
trained), its data prepared as a run prepares it -- with the run's own tokenizer -- and scored by the run's own
evaluation (:func:`mtft.evaluation.evaluate.evaluate`, with the majority-class baseline), so that the same
languages give the run's ``metrics.json``. The result is a folder of its own, written whole or not at all:
``metrics.json``, ``predictions/<split>/<task>/<language>.jsonl``, ``report.md`` and the ``config.yaml`` evaluated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import datasets

from mtft.api.run import TrainedRun, load_run, output_policy
from mtft.config import config_to_yaml
from mtft.config.run_config import RunConfig
from mtft.core.atomic import write_json, write_text
from mtft.core.errors import CheckpointError, ConfigError, DataError, UserError
from mtft.core.registry import plugin_code
from mtft.data.batching import BatchBuilder
from mtft.data.pipeline import PreparedData, prepare_data
from mtft.data.selection import select_tasks, trained_languages
from mtft.evaluation.evaluate import Evaluation, evaluate, metrics_record, write_predictions
from mtft.evaluation.majority import majority_baselines
from mtft.models.folders import read_json
from mtft.reporting.report import Report
from mtft.runs import read_run_config
from mtft.training.restore import RUN_CONFIG, find_run_dir

OVERRIDABLE = ("data.", "evaluation.")  # what is evaluated; anything else would change what was trained


def evaluation_config(run_dir: Path, overrides: Sequence[str]) -> RunConfig:
    """The run's config with ``overrides`` (``data.*`` and ``evaluation.*`` keys only) applied and validated, its
    tasks selected for evaluation: what the run trained on is its own config's, so dropping a source language or
    adding a target is no conflict with ``source_languages`` (:func:`select_tasks` with ``trained``)."""
    for item in overrides:
        if not item.startswith(OVERRIDABLE):
            raise ConfigError(
                f"override {item!r}: run.py evaluate takes data.* and evaluation.* overrides (what is evaluated); "
                "other keys describe what was trained"
            )
    root, _ = find_run_dir(run_dir)
    try:
        config = read_run_config(root, overrides)
        run_config = read_run_config(root)
        trained = trained_languages(run_config.data, run_config.evaluation.split)
    except UserError as error:
        raise ConfigError(f"{root}/config.yaml: {error}") from None
    # unknown tasks, languages or settings: refused before any data or model loads
    select_tasks(config.data, config.evaluation.split, trained)
    return config


def evaluate_run(
    run_dir: Path,
    out: Path,
    overrides: Sequence[str] = (),
    checkpoint: Optional[str] = None,
    trust_plugins: bool = False,
) -> Evaluation:
    """Evaluate ``run_dir`` (at ``checkpoint``, see :func:`mtft.api.load_run`) as ``overrides`` say; write it to
    ``out``, which must not exist or be empty and may not lie inside the run folder (:func:`output_policy`)."""
    with plugin_code(trust_plugins, RUN_CONFIG):
        return _evaluate_run(run_dir, out, overrides, checkpoint)


def _evaluate_run(run_dir: Path, out: Path, overrides: Sequence[str], checkpoint: Optional[str]) -> Evaluation:
    config = evaluation_config(run_dir, overrides)
    policy = output_policy(run_dir)
    policy.check_folder(out)
    run = load_run(run_dir, checkpoint)
    datasets.disable_progress_bars()
    trained = trained_languages(run.config.data, run.config.evaluation.split)
    tokenizer = run.loaded.tokenizer
    heads = {name: run.label_names(name) for name in run.tasks}  # what the run's heads mean by a label id
    data = prepare_data(
        config.data, config.evaluation.split, config.weighting.objectives, lambda _: tokenizer, trained, heads
    )
    _route_like_the_run(data, run)
    result = evaluate(run.loaded.model, data, BatchBuilder(data), config.evaluation.batch_size, "cpu")
    result.metrics.update(majority_baselines(data))
    step = checkpoint_step(run.loaded.checkpoint)
    with policy.writing_folder(out, kind="evaluation", run=str(run.run_dir.resolve())) as partial:
        write_predictions(partial, config.evaluation.split, result.predictions)
        write_json(partial / "metrics.json", metrics_record(step, result.metrics, data))
        write_text(partial / "config.yaml", config_to_yaml(config))
        setup = [
            ("run", str(run.run_dir)),
            ("checkpoint", f"{run.loaded.checkpoint.name} (step {step})"),
            ("backbone", config.model.backbone),
            ("method", config.model.adapter.method),
            ("evaluation split", config.evaluation.split),
        ]
        Report(f"{config.run.name} evaluated", setup, result.metrics, data.report_tables()).write(partial)
    return result


def _route_like_the_run(data: PreparedData, run: TrainedRun) -> None:
    """Every head the evaluation needs is one the run trained, with its label names; rows are routed to the run's
    own objectives (an evaluation that adds a language trains none, so the data's objective list is not the run's)."""
    heads = run.loaded.heads
    for name in data.head_tasks():
        if name not in heads:
            raise ConfigError(f"task {name!r} has no head in the run {run.run_dir}; its tasks: {', '.join(heads)}")
        if list(heads[name]["label_names"]) != list(data.tasks[name].label_names):
            raise DataError(
                f"task {name!r}: the data's label names {data.tasks[name].label_names} are not those the run "
                f"trained, {heads[name]['label_names']}"
            )
    objectives = run.loaded.objectives
    data.eval_objective = {
        key: objectives.index(data.objective_names[index])
        for key, index in data.eval_objective.items()
        if data.objective_names[index] in objectives
    }


def checkpoint_step(checkpoint: Path) -> Optional[int]:
    """The training step of ``checkpoint``'s weights (a training checkpoint's state, or best/'s metrics)."""
    for name in ("trainer_state.json", "metrics.json"):
        if (checkpoint / name).is_file():
            record = read_json(checkpoint / name)
            return record.get("step") if isinstance(record, dict) else None
    raise CheckpointError(f"{checkpoint}: no trainer_state.json or metrics.json to read its step from")
