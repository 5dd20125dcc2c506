"""``run.py --config X --plan``: what a run of the config would train and evaluate on, checked and printed without
reading a row, loading a model or reaching the Hub.

The checks are those of a run's preflight on ``data.tasks`` (:func:`mtft.data.selection.check_tasks`: tasks,
languages, sources and targets, protocols, settings, the evaluation split, ``evaluation.metric_for_best`` and
``select_on``, local data files); the lines say, per task, its source and target languages, which dataset splits
it reads for each, and which metric selects the best checkpoint. A config meant for a GPU machine with Hub access
can so be validated on a laptop; what needs the rows or the backbone is checked when the run (or ``--prefetch``)
loads them.
"""

from __future__ import annotations

from mtft.config.schema import DataSection, EvaluationSection
from mtft.data.selection import SelectedTask, check_tasks, selection_metric
from mtft.data.sources import describe_source


def describe_plan(data: DataSection, evaluation: EvaluationSection, backbone: str) -> list[str]:
    """The plan's lines (a :class:`~mtft.core.errors.ConfigError` or ``DataError`` for what the preflight refuses).
    ``backbone`` (``model.backbone``) is only named: the plan loads no model."""
    selected = check_tasks(data, evaluation)
    split = evaluation.split
    lines = [f"backbone {backbone} (not loaded by --plan); evaluation split {split}"]
    for chosen in selected:
        lines += _task_lines(chosen, split, data.sources)
    key = evaluation.metric_for_best
    if key is None:
        lines.append("model selection: none (evaluation.metric_for_best is null)")
    else:
        dev = data.dev_split is not None
        read = selection_metric(
            evaluation,
            {c.name: c.languages for c in selected},
            {c.name: c.target_languages() for c in selected},
            dev,
        )
        on = "the dev set held out of the training splits" if dev else f"{split}"
        lines.append(
            f"model selection: metric_for_best {key} reads {read} on {on} (evaluation.select_on={evaluation.select_on})"
        )
    return lines


def _task_lines(chosen: SelectedTask, split: str, sources: dict[str, str]) -> list[str]:
    targets = chosen.target_languages()
    trained = chosen.training_languages()
    head = f"{chosen.name} ({chosen.protocol}): "
    if chosen.task.evaluate_with is not None:
        head += f"evaluated with the head of {chosen.task.evaluate_with}, trains on nothing of its own"
    else:
        head += f"sources {', '.join(trained)}; targets {', '.join(targets) if targets else 'none'}"
    lines = [head]
    reads: dict[tuple[str, str], list[str]] = {}  # (split, where from, {language} unfilled) -> languages, in order
    for kind, lang, _ in chosen.refs(split):
        template = chosen.task.dataset_ref(kind, "{language}", chosen.protocol)
        reads.setdefault((kind, describe_source(template, sources)), []).append(lang)
    lines += [f"  {kind} {where}: {', '.join(langs)}" for (kind, where), langs in reads.items()]
    return lines
