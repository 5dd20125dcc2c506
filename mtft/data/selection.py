"""The config's task list resolved against the task definitions, without reading any data.

Which tasks a run uses, with which settings, languages and protocol, and which splits it will read: an unknown
task, a language the task does not have, a protocol it does not support, a bad setting, a task listed twice or an
evaluation-only task without the task whose head it borrows are refused here. Data preparation, ``--prefetch`` and
a run's preflight (:mod:`mtft.training.preflight`) all start from :func:`select_tasks`, so they agree.

Selection is for a run that trains, or (``trained``) for evaluating a finished run (``run.py evaluate``): nothing is
trained then, so what concerns training only -- ``source_languages``, the training splits -- neither is checked nor
decides the sources; a task's sources are the evaluated languages the run trained it on, the rest its targets --
among them, languages its task file does not declare (the data, through ``data.sources``, says whether it has them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from mtft.config.schema import DataSection, EvaluationSection, TaskSelection
from mtft.core.errors import ConfigError
from mtft.core.paths import check_name
from mtft.data.sources import check_local_files
from mtft.tasks.base import DatasetRef, Task
from mtft.tasks.registry import discover_tasks, get_task


@dataclass(frozen=True)
class SelectedTask:
    task: Task  # with the config's settings applied
    selection: TaskSelection
    languages: list[str]  # evaluated
    protocol: str
    # selected to evaluate a finished run: the languages it trained the task on (None: selected for training)
    trained: Optional[tuple[str, ...]] = None

    @property
    def name(self) -> str:
        return self.task.name

    @property
    def evaluating(self) -> bool:
        """Selected to evaluate a finished run (``select_tasks(data, eval_split, trained)``): nothing is trained."""
        return self.trained is not None

    def training_languages(self) -> list[str]:
        """The sources: ``source_languages`` when given, else the protocol's (an evaluation-only task: none);
        evaluating a finished run, the languages it trained on, whatever the evaluated config says."""
        if self.trained is not None:
            return list(self.trained)
        if self.selection.source_languages is not None and self.task.evaluate_with is None:
            return list(self.selection.source_languages)
        return self.task.training_languages(self.languages, self.protocol)

    def target_languages(self) -> list[str]:
        """The evaluated languages the task never trains on (zero-shot transfer); none for an evaluation-only task,
        which trains nothing of its own. Evaluating a finished run that trained on none of them: all of them."""
        if self.task.evaluate_with is not None:
            return []
        sources = self.training_languages()
        return [lang for lang in self.languages if lang not in sources]

    def refs(self, eval_split: str) -> list[tuple[str, str, DatasetRef]]:
        """(split, language, where it comes from) of every split the run reads: training (none when evaluating a
        finished run), then evaluation."""
        wanted = [] if self.evaluating else [("train", lang) for lang in self.training_languages()]
        wanted += [(eval_split, lang) for lang in self.languages]
        return [(split, lang, self.task.dataset_ref(split, lang, self.protocol)) for split, lang in wanted]


def select_tasks(
    data: DataSection, eval_split: str, trained: Optional[Mapping[str, Sequence[str]]] = None
) -> list[SelectedTask]:
    """``data.tasks`` resolved and checked, in config order (task plug-ins of the listed tasks are imported).

    ``eval_split`` (``evaluation.split``): the split every evaluated language is scored on, which each task must
    have. ``trained``: select to evaluate a finished run, which trained each task on these languages
    (:func:`trained_languages` of its own config); a task it did not train trains on none."""
    available = discover_tasks(data.task_dirs)
    selected: dict[str, SelectedTask] = {}
    for selection in data.tasks:
        if selection.name in selected:
            raise ConfigError(f"task {selection.name!r} is listed twice in data.tasks")
        task = get_task(selection.name, available).configured(selection.settings, f"data.tasks ({selection.name})")
        languages = selection.languages or list(task.languages)
        unknown = [lang for lang in languages if lang not in task.languages]
        if unknown and trained is None:
            raise ConfigError(
                f"task {task.name!r} has no language(s) {', '.join(unknown)}; valid: {', '.join(task.languages)}"
            )
        for lang in unknown:  # evaluating a finished run: any language its data has is a target (a file name)
            check_name(lang, f"data.tasks ({task.name}).languages")
        protocol = selection.protocol or task.default_protocol
        if protocol not in task.protocols:
            raise ConfigError(f"task {task.name!r} does not support protocol {protocol!r}; valid: {task.protocols}")
        ran = None if trained is None else tuple(trained.get(selection.name, ()))
        chosen = SelectedTask(task, selection, languages, protocol, ran)
        if not chosen.evaluating:  # what the run trains on; a finished run's sources are what it trained on
            _check_sources(chosen)
        _check_evaluation_split(chosen, eval_split)
        selected[selection.name] = chosen
    _check_head_owners(selected)
    return list(selected.values())


def trained_languages(data: DataSection, eval_split: str) -> dict[str, list[str]]:
    """Each task's training languages under a run's own ``data`` and ``evaluation.split`` (selected and checked as
    the run selected them): what :func:`select_tasks` takes as ``trained`` to evaluate that run once it is
    finished, on the languages of a config with other ``data.*``."""
    return {chosen.name: chosen.training_languages() for chosen in select_tasks(data, eval_split)}


def _check_sources(chosen: SelectedTask) -> None:
    """``source_languages``: languages of the task, evaluated too, each with training data of its own language."""
    task, sources = chosen.task, chosen.selection.source_languages
    if sources is None:
        return
    unknown = [lang for lang in sources if lang not in task.languages]
    if unknown:
        raise ConfigError(
            f"task {task.name!r}: source_languages has no language(s) {', '.join(unknown)} of the task; "
            f"valid: {', '.join(task.languages)}"
        )
    unevaluated = [lang for lang in sources if lang not in chosen.languages]
    if unevaluated:
        raise ConfigError(
            f"task {task.name!r}: source language(s) {', '.join(unevaluated)} not in its languages "
            f"[{', '.join(chosen.languages)}]: a source is evaluated too (its validation selects the model); add it"
        )
    if task.evaluate_with is not None:
        raise ConfigError(
            f"task {task.name!r} is evaluated with the head of {task.evaluate_with!r} and trains on nothing: "
            "remove its source_languages"
        )
    for lang in sources:
        ref = task.dataset_ref("train", lang, chosen.protocol)
        if ref.language is not None and ref.language != lang:
            raise ConfigError(
                f"task {task.name!r}: source language {lang!r} has no training data under protocol "
                f"{chosen.protocol!r} ({ref.describe()} is {ref.language} only); use protocol in_language "
                f"(each language's own training split) or source_languages [{ref.language}]"
            )


def _check_evaluation_split(chosen: SelectedTask, split: str) -> None:
    """Every evaluated language -- a target above all, which has nothing else -- needs the evaluation split."""
    if split not in chosen.task.data:
        targets = chosen.target_languages()
        what = f"target language(s) {', '.join(targets)}" if targets else f"language(s) {', '.join(chosen.languages)}"
        raise ConfigError(
            f"task {chosen.name!r} has no {split!r} split to evaluate its {what} on; its splits: "
            f"{', '.join(chosen.task.data)}: set evaluation.split to one of them"
        )


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


def check_tasks(data: DataSection, evaluation: EvaluationSection) -> list[SelectedTask]:
    """Everything about ``data.tasks`` that can be checked without reading rows: the tasks, languages, protocols
    and settings, ``evaluation.metric_for_best``, and that every local data file exists and is UTF-8."""
    selected = select_tasks(data, evaluation.split)  # imports the tasks' plug-ins
    check_metric_for_best(data, evaluation, selected)
    for chosen in selected:
        for _, _, ref in chosen.refs(evaluation.split):
            check_local_files(ref, data.sources)
    return selected


def check_metric_for_best(data: DataSection, evaluation: EvaluationSection, selected: list[SelectedTask]) -> None:
    """``evaluation.metric_for_best`` is a metric of what selection scores, read on the languages of
    ``evaluation.select_on`` (:func:`selection_metric`). ``data`` is read for ``dev_split`` alone: when it is set,
    selection scores the dev set."""
    key = evaluation.metric_for_best
    if key is None:
        return
    # data.dev_split: selection scores the dev set, held out of the training languages' training splits only
    dev = data.dev_split is not None
    scored = [(c, c.training_languages() if dev else c.languages) for c in selected]
    valid = [f"{c.name}/{m}" for c, langs in scored if langs for m in c.task.metrics]
    valid += [f"{c.name}/{lang}/{m}" for c, langs in scored for lang in langs for m in c.task.metrics]
    if key not in valid:
        where = "of the dev set (data.dev_split)" if dev else "of this run"
        raise ConfigError(f"evaluation.metric_for_best={key!r} is not a metric {where}; valid: {', '.join(valid)}")
    selection_metric(
        evaluation,
        {c.name: c.languages for c in selected},
        {c.name: c.target_languages() for c in selected},
        dev,
    )


def selection_metric(
    evaluation: EvaluationSection,
    languages: Mapping[str, Sequence[str]],
    targets: Mapping[str, Sequence[str]],
    dev: bool,
) -> str:
    """The metrics key that best-checkpoint selection and early stopping read for ``evaluation.metric_for_best``
    (a key :func:`check_metric_for_best` accepted), given each task's evaluated and target languages.

    The aggregate follows ``evaluation.select_on``: ``'<task>/<metric>'`` is the macro over the task's source
    languages (``<task>/source_<metric>``), all its languages, or its targets (``<task>/target_<metric>``), and a
    per-language key must name a language of that group. By default only sources are read: a zero-shot set-up
    that selects on target-language validation has used target labels (Schmidt et al., 2023, "Free lunch:
    robust cross-lingual transfer via model checkpoint averaging"). A task without targets is all sources;
    so is the dev set of ``data.dev_split`` (held out of the training splits)."""
    key, select_on = evaluation.metric_for_best, evaluation.select_on
    assert key is not None
    task, *rest = key.split("/")
    scored_targets = [] if dev else list(targets.get(task, []))
    if select_on == "all":
        return key
    if select_on == "target" and not scored_targets:
        where = "the dev set (data.dev_split) holds source languages only" if dev else "it has none"
        raise ConfigError(
            f"evaluation.select_on=target selects on task {task!r}'s target languages, and {where}: "
            "set evaluation.select_on=source"
        )
    if not scored_targets:
        return key
    if len(rest) == 2:  # one language's metric
        role = "target" if rest[0] in scored_targets else "source"
        if role != select_on:
            raise ConfigError(
                f"evaluation.metric_for_best={key!r} reads {rest[0]!r}, a {role} language of task {task!r}, and "
                f"evaluation.select_on={select_on} selects on {select_on} languages only: set "
                f"evaluation.select_on={role} (or all) to select on it"
            )
        return key
    if select_on == "source" and not [lang for lang in languages[task] if lang not in scored_targets]:
        raise ConfigError(
            f"evaluation.select_on=source: task {task!r} evaluates none of its source languages (its languages "
            f"{', '.join(languages[task])} are all targets): add a source to its languages, or set "
            "evaluation.select_on=target to select on target labels"
        )
    return f"{task}/{select_on}_{rest[0]}"
