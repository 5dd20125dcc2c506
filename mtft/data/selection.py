"""The config's task list resolved against the task definitions, without reading any data.

Which tasks a run uses, with which settings, languages and protocol, and which splits it will read: an unknown
task, a language the task does not have, a protocol it does not support, a bad setting, a task listed twice or an
evaluation-only task without the task whose head it borrows are refused here. Data preparation, ``--prefetch`` and
a run's preflight (:mod:`mtft.training.preflight`) all start from :func:`select_tasks`, so they agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from mtft.config.schema import RunConfig, TaskSelection
from mtft.core.errors import ConfigError
from mtft.data.sources import check_local_files
from mtft.tasks.base import DatasetRef, Task
from mtft.tasks.registry import discover_tasks, get_task


@dataclass(frozen=True)
class SelectedTask:
    task: Task  # with the config's settings applied
    selection: TaskSelection
    languages: list[str]  # evaluated
    protocol: str

    @property
    def name(self) -> str:
        return self.task.name

    def training_languages(self) -> list[str]:
        return self.task.training_languages(self.languages, self.protocol)

    def refs(self, eval_split: str) -> list[tuple[str, str, DatasetRef]]:
        """(split, language, where it comes from) of every split the run reads: training, then evaluation."""
        wanted = [("train", lang) for lang in self.training_languages()]
        wanted += [(eval_split, lang) for lang in self.languages]
        return [(split, lang, self.task.dataset_ref(split, lang, self.protocol)) for split, lang in wanted]


def select_tasks(config: RunConfig) -> list[SelectedTask]:
    """``data.tasks`` resolved and checked, in config order (task plug-ins of the listed tasks are imported)."""
    available = discover_tasks(config.data.task_dirs)
    selected: dict[str, SelectedTask] = {}
    for selection in config.data.tasks:
        if selection.name in selected:
            raise ConfigError(f"task {selection.name!r} is listed twice in data.tasks")
        task = get_task(selection.name, available).configured(selection.settings, f"data.tasks ({selection.name})")
        languages = selection.languages or list(task.languages)
        unknown = [lang for lang in languages if lang not in task.languages]
        if unknown:
            raise ConfigError(
                f"task {task.name!r} has no language(s) {', '.join(unknown)}; valid: {', '.join(task.languages)}"
            )
        protocol = selection.protocol or task.default_protocol
        if protocol not in task.protocols:
            raise ConfigError(f"task {task.name!r} does not support protocol {protocol!r}; valid: {task.protocols}")
        selected[selection.name] = SelectedTask(task, selection, languages, protocol)
    _check_head_owners(selected)
    return list(selected.values())


def _check_head_owners(selected: dict[str, SelectedTask]) -> None:
    """An evaluation-only task needs its head's task in the run, as a task that trains its own head."""
    for name, chosen in selected.items():
        owner = chosen.task.evaluate_with
        if owner is None:
            continue
        if owner not in selected or selected[owner].task.evaluate_with is not None:
            raise ConfigError(
                f"task {name!r} is evaluated with the head of task {owner!r}; add {owner!r} to "
                "data.tasks" + ("" if owner not in selected else " as a task that trains its own head")
            )


def check_tasks(config: RunConfig) -> list[SelectedTask]:
    """Everything about ``data.tasks`` that can be checked without reading rows: the tasks, languages, protocols
    and settings, ``evaluation.metric_for_best``, and that every local data file exists and is UTF-8."""
    selected = select_tasks(config)  # imports the tasks' plug-ins
    check_metric_for_best(config, selected)
    for chosen in selected:
        for _, _, ref in chosen.refs(config.evaluation.split):
            check_local_files(ref, config.data.sources)
    return selected


def check_metric_for_best(config: RunConfig, selected: list[SelectedTask]) -> None:
    key = config.evaluation.metric_for_best
    if key is None:
        return
    # data.dev_split: selection scores the dev set, held out of the training languages' training splits only
    dev = config.data.dev_split is not None
    scored = [(c, c.training_languages() if dev else c.languages) for c in selected]
    valid = [f"{c.name}/{m}" for c, langs in scored if langs for m in c.task.metrics]
    valid += [f"{c.name}/{lang}/{m}" for c, langs in scored for lang in langs for m in c.task.metrics]
    if key not in valid:
        where = "of the dev set (data.dev_split)" if dev else "of this run"
        raise ConfigError(f"evaluation.metric_for_best={key!r} is not a metric {where}; valid: {', '.join(valid)}")
