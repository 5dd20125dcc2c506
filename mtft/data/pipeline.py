"""From the config's task selection to tokenised training and evaluation data.

All loading and checking happens here, before a run writes anything: unknown tasks or languages, missing
files, missing columns and out-of-range labels fail with one clear error.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

import datasets
import numpy as np

from mtft.config.schema import DataSection, LeaveOutSection
from mtft.core.errors import DataError
from mtft.data import leave_out
from mtft.data.checks import check_rows, warn_suspicious_rows, warn_unknown_pieces
from mtft.data.selection import SelectedTask, select_tasks
from mtft.data.sources import describe_read, describe_source, load_split, one_module_per_dataset
from mtft.reporting.report import TaskTable
from mtft.tasks.base import Task, unique_by_id
from mtft.tasks.columns import column_values
from mtft.tasks.hidden import HiddenLabelsError, check_not_hidden

logger = logging.getLogger("mtft")

DEV = "dev"  # the split name of data.dev_split's held-out examples in TaskData.origin
ENCODING_VERSION = "2"  # bump when the encoding of rows changes, to invalidate cached tokenisations


@dataclass(frozen=True)
class Objective:
    """One (task, language) pair: the unit of data, evaluation and (by default) loss weighting."""

    task: str
    language: str

    @property
    def key(self) -> str:
        return f"{self.task}/{self.language}"


@dataclass
class TaskData:
    task: Task
    protocol: str
    languages: list[str]  # evaluated
    max_length: int = 128  # tokens per encoded row
    targets: list[str] = field(default_factory=list)  # evaluated, never trained on (zero-shot transfer)
    eval_split: str = "validation"
    label_names: list[str] = field(default_factory=list)
    raw_train: dict[str, datasets.Dataset] = field(default_factory=dict)  # evaluating a run: its baseline's labels
    raw_eval: dict[str, datasets.Dataset] = field(default_factory=dict)
    train: dict[str, datasets.Dataset] = field(default_factory=dict)
    eval: dict[str, datasets.Dataset] = field(default_factory=dict)
    raw_dev: dict[str, datasets.Dataset] = field(default_factory=dict)  # data.dev_split: held out of raw_train
    dev: dict[str, datasets.Dataset] = field(default_factory=dict)
    origin: dict[tuple[str, str], str] = field(default_factory=dict)  # (split, language) -> where it came from
    # data.leave_out, per training language: the removed examples' positions in raw_train (which stays whole, so
    # that S and S^i share one tokenisation) and ids, and the positions of the encoded rows ``train`` kept
    left_out: dict[str, np.ndarray] = field(default_factory=dict)
    left_out_ids: dict[str, set[str]] = field(default_factory=dict)
    train_kept: dict[str, np.ndarray] = field(default_factory=dict)
    train_whole: dict[str, int] = field(default_factory=dict)  # encoded rows of the whole split, before the drop

    def trained_raw(self, lang: str) -> datasets.Dataset:
        """The raw examples the run trains on: raw_train less data.leave_out's removed examples."""
        raw = self.raw_train[lang]
        if lang not in self.left_out:
            return raw
        return raw.select(np.setdiff1d(np.arange(len(raw)), self.left_out[lang]).tolist())


@dataclass
class PreparedData:
    tasks: dict[str, TaskData]
    tokenizer: Any
    train_units: list[Objective]  # (task, language) training datasets, in a fixed order
    unit_objective: list[int]  # training unit -> loss objective index (after weighting.objectives grouping)
    objective_names: list[str]
    # evaluated (task, language) -> its loss objective, where it is trained (zero-shot languages are not)
    eval_objective: dict[tuple[str, str], int] = field(default_factory=dict)

    def train_dataset(self, unit: int) -> datasets.Dataset:
        obj = self.train_units[unit]
        return self.tasks[obj.task].train[obj.language]

    def train_layout(self) -> tuple[list[Optional[np.ndarray]], list[int]]:
        """Per training unit, the positions of its rows among the whole split's encoded rows (data.leave_out; None:
        every row), and the whole split's row count: the sampler visits the whole split's order with the other
        rows skipped."""
        kept = [self.tasks[obj.task].train_kept.get(obj.language) for obj in self.train_units]
        whole = [
            self.tasks[obj.task].train_whole.get(obj.language, len(self.train_dataset(unit)))
            for unit, obj in enumerate(self.train_units)
        ]
        return kept, whole

    def eval_objectives(self, dev: bool = False) -> list[Objective]:
        """What an evaluation scores: every evaluated (task, language), or with ``dev`` those with a dev set."""
        if dev:
            return [Objective(name, lang) for name, td in self.tasks.items() for lang in td.dev]
        return [Objective(name, lang) for name, td in self.tasks.items() for lang in td.languages]

    def head_of(self, task: str) -> str:
        """The task whose head predicts ``task``: itself, or the one named by its ``evaluate_with``."""
        return self.tasks[task].task.evaluate_with or task

    def head_tasks(self) -> list[str]:
        """The tasks that own a head, in run order (evaluation-only tasks borrow one of theirs)."""
        return [name for name, td in self.tasks.items() if td.task.evaluate_with is None]

    def report_tables(self) -> dict[str, TaskTable]:
        """Each task's table of the report: its metrics, evaluated languages, targets and metric variant."""
        return {
            name: TaskTable(list(td.task.metrics), td.languages, td.targets, td.task.metric_description())
            for name, td in self.tasks.items()
        }


def prepare_data(
    data: DataSection,
    eval_split: str,
    objectives: str,
    make_tokenizer: Callable[[list[str]], Any],
    trained: Optional[Mapping[str, Sequence[str]]] = None,
    label_names: Optional[Mapping[str, Sequence[str]]] = None,
) -> PreparedData:
    """Load, check and tokenise every task of ``data``, with ``eval_split`` (``evaluation.split``) as the evaluation
    split and one objective per ``objectives`` (``weighting.objectives``: a task and language, a task or a
    language); ``make_tokenizer(texts)`` returns the tokenizer to use.

    ``trained`` (:func:`~mtft.data.selection.trained_languages` of a finished run's own config): prepare to
    evaluate that run. Nothing is trained, so only the evaluation split is required, encoded and checked; the
    run's training splits are read, where they can be, for the majority-class baseline alone
    (:func:`_read_trained_labels`), and the objectives are the run's, for the evaluated languages it trained on.
    ``label_names`` (task -> the names its head was trained with, a finished run's): what a task's data without a
    ClassLabel column (a JSON file through ``data.sources``) means by its label ids."""
    selected = select_tasks(data, eval_split, trained)
    with one_module_per_dataset():  # a dataset's configs and splits read its card once
        tasks = {
            chosen.name: _load_task(chosen, data, eval_split, (label_names or {}).get(chosen.name))
            for chosen in selected
        }
    _check_borrowed_heads(tasks)
    tokenizer = make_tokenizer(_all_texts(tasks))
    for td in tasks.values():
        origin = td.origin
        td.eval = {lang: encode_split(td, ds, origin[eval_split, lang], tokenizer) for lang, ds in td.raw_eval.items()}
        if trained is None:
            _encode_training(td, tokenizer)
    units = [Objective(chosen.name, lang) for chosen in selected for lang in chosen.training_languages()]
    names, unit_objective = _group(units, objectives)
    key = _objective_key(objectives)
    eval_objective = {
        (name, lang): names.index(key(Objective(name, lang)))
        for name, td in tasks.items()
        for lang in td.languages
        if key(Objective(name, lang)) in names
    }
    if trained is not None:  # evaluating: the run's objectives name what it trained; there is nothing to train
        units, unit_objective = [], []
    return PreparedData(tasks, tokenizer, units, unit_objective, names, eval_objective)


def _encode_training(td: TaskData, tokenizer: Any) -> None:
    """Encode the training splits and data.dev_split's held-out examples; drop data.leave_out's rows."""
    td.train = {lang: encode_split(td, ds, td.origin["train", lang], tokenizer) for lang, ds in td.raw_train.items()}
    td.dev = {lang: encode_split(td, ds, td.origin[DEV, lang], tokenizer) for lang, ds in td.raw_dev.items()}
    for lang, gone in td.left_out_ids.items():  # encoded whole (S's cache), then S^i's rows dropped
        td.train_whole[lang] = len(td.train[lang])
        td.train[lang], td.train_kept[lang] = leave_out.drop_rows(td.train[lang], gone)


def task_texts(data: DataSection, eval_split: str) -> list[str]:
    """The raw texts of every task of ``data`` (what a locally trained tokenizer of the run is trained on), its
    training splits and ``eval_split`` (``evaluation.split``), loaded and checked as :func:`prepare_data` does, not
    tokenised."""
    return _all_texts({chosen.name: _load_task(chosen, data, eval_split) for chosen in select_tasks(data, eval_split)})


def task_training_texts(data: DataSection, eval_split: str) -> list[str]:
    """The text of every task's training split (each of its text columns; never the label or id column), for
    SURT's masked-LM re-training (Fu, So & Collier, 2023, §3.3): evaluation splits and evaluation-only tasks are
    left out, so no text the run is scored on is trained on; so are data.leave_out's removed examples.
    ``eval_split`` (``evaluation.split``) is read too: the tasks are loaded and checked as the run loads them."""
    texts: list[str] = []
    for chosen in select_tasks(data, eval_split):
        if chosen.task.evaluate_with is not None:
            continue
        td = _load_task(chosen, data, eval_split)
        for lang in td.raw_train:
            texts.extend(td.task.texts(td.trained_raw(lang)))
    return texts


def _load_task(chosen: SelectedTask, data: DataSection, split: str, known: Optional[Sequence[str]] = None) -> TaskData:
    """One selected task's splits, loaded and checked (``split``: the evaluation split; ``known``: the label names
    of the run's head, for data that declares none)."""
    task, selection, languages = chosen.task, chosen.selection, chosen.languages
    td = TaskData(
        task,
        chosen.protocol,
        languages,
        max_length=selection.max_length or data.max_length,
        targets=chosen.target_languages(),
        eval_split=split,
    )
    if not chosen.evaluating:
        for lang in chosen.training_languages():
            _load_training(td, lang, selection.max_train_examples, data)
    for lang in languages:
        td.raw_eval[lang] = _load(td, split, lang, selection.max_eval_examples, data)
    label_sets = {tuple(_label_names(task, ds, known)) for ds in [*td.raw_train.values(), *td.raw_eval.values()]}
    if len(label_sets) > 1:
        raise DataError(f"task {task.name!r}: splits disagree on label names: {sorted(label_sets)}")
    td.label_names = list(label_sets.pop())
    if chosen.evaluating and task.evaluate_with is None:
        _read_trained_labels(td, chosen.training_languages(), selection.max_train_examples, data)
    for lang, dataset in td.raw_eval.items():  # duplicate example ids or bad references stop the run now,
        try:  # not at its first evaluation
            task.references(dataset, td.label_names, td.origin[split, lang])
        except HiddenLabelsError:  # a benchmark test set: predicted, not scored; its ids must still be unique
            unique_by_id(task.split_ids(dataset), [None] * len(dataset), td.origin[split, lang])
    return td


def _label_names(task: Task, dataset: datasets.Dataset, known: Optional[Sequence[str]]) -> list[str]:
    """The dataset's label names (its ClassLabel, else the task's own), else the names the run's head knows."""
    try:
        return task.resolve_label_names(dataset)
    except DataError:
        if known is None:
            raise
        return list(known)


def _load_training(td: TaskData, lang: str, limit: Optional[int], data: DataSection) -> None:
    """The training split of ``lang`` as the run trains on it: labelled, data.dev_split and data.leave_out applied."""
    task = td.task
    td.raw_train[lang] = _load(td, "train", lang, limit, data)
    check_not_hidden(task, column_values(td.raw_train[lang], task.label_column), td.origin["train", lang], "trained on")
    if data.dev_split is not None:
        _hold_out_dev(td, lang, data.dev_split, data.dev_split_seed)
    if data.leave_out is not None:
        _leave_out(td, lang, data.leave_out)


def _read_trained_labels(td: TaskData, languages: Sequence[str], limit: Optional[int], data: DataSection) -> None:
    """Evaluating a finished run: its training splits (``languages``, all it trained the task on) read as it read
    them, for the majority-class baseline alone (:mod:`mtft.evaluation.majority`), so that the same data gives the
    run's own baseline. Nothing is trained, so none is required: where one cannot be read -- evaluation-only data
    has no training split -- or disagrees with the evaluation split's label names, the task has no baseline (its
    ``majority_*`` metrics are absent) and the log says why."""
    scratch = TaskData(td.task, td.protocol, td.languages, eval_split=td.eval_split, origin=dict(td.origin))
    try:
        for lang in languages:
            _load_training(scratch, lang, limit, data)
            names = _label_names(td.task, scratch.raw_train[lang], td.label_names)
            if names != td.label_names:
                raise DataError(f"{scratch.origin['train', lang]}: label names {names}, not {td.label_names}")
    except DataError as error:
        logger.warning(f"task {td.task.name!r}: no majority-class baseline (no training labels to count): {error}")
        return
    td.raw_train, td.raw_dev, td.origin = scratch.raw_train, scratch.raw_dev, scratch.origin
    td.left_out, td.left_out_ids = scratch.left_out, scratch.left_out_ids


def _hold_out_dev(td: TaskData, lang: str, fraction: float, seed: int) -> None:
    """data.dev_split: a seeded random ``fraction`` of the language's training examples becomes its dev set.
    Raw examples are split, before encoding, so the windows or choices of one example stay on one side."""
    train, where = td.raw_train[lang], td.origin["train", lang]
    try:
        parts = train.train_test_split(test_size=fraction, shuffle=True, seed=seed)
    except ValueError as error:  # too few examples for both sides to be non-empty
        raise DataError(f"{where}: data.dev_split={fraction} cannot split {len(train)} example(s): {error}") from None
    td.raw_train[lang], td.raw_dev[lang] = parts["train"], parts["test"]
    td.origin[DEV, lang] = f"{where}, dev {fraction:g} held out (seed {seed})"


def _leave_out(td: TaskData, lang: str, spec: LeaveOutSection) -> None:
    """data.leave_out: choose the examples S^i removes from what remains of the training split (after dev_split)."""
    raw, where = td.raw_train[lang], td.origin["train", lang]
    removed = leave_out.choose_removed(len(raw), spec, td.task.name, lang, where)
    td.left_out_ids[lang] = leave_out.removed_ids(td.task.split_ids(raw), removed, where)
    td.left_out[lang] = removed
    td.origin["train", lang] = f"{where}, {leave_out.describe(spec, len(removed))}"
    logger.info(f"{where}: data.leave_out removes {len(removed)} of {len(raw)} training examples (seed {spec.seed})")


def _check_borrowed_heads(tasks: dict[str, TaskData]) -> None:
    """An evaluation-only task predicts with its owner's head (present: :func:`select_tasks`): same head kind and
    label names."""
    for name, td in tasks.items():
        owner = td.task.evaluate_with
        if owner is None:
            continue
        theirs = tasks[owner]
        if (theirs.task.head, theirs.label_names) != (td.task.head, td.label_names):
            raise DataError(
                f"task {name!r} cannot use the head of {owner!r}: {td.task.head} head with labels "
                f"{td.label_names} vs {theirs.task.head} head with labels {theirs.label_names}"
            )


def _load(td: TaskData, split: str, lang: str, limit: Optional[int], data: DataSection):
    dataset, td.origin[split, lang] = load_task_split(
        td.task, split, lang, td.protocol, data.sources, data.cache_dir, limit
    )
    return dataset


def load_task_split(
    task: Task,
    split: str,
    lang: str,
    protocol: str,
    sources: dict[str, str],
    cache_dir: Optional[str],
    limit: Optional[int] = None,
) -> tuple[datasets.Dataset, str]:
    """One split of one language of ``task``, checked (columns, the task's own checks), and where it came from."""
    ref = task.dataset_ref(split, lang, protocol)
    dataset = load_split(ref, sources, cache_dir)
    where = describe_source(ref, sources)
    if task.language_id_prefixes:  # one split holds every language: say which rows
        where += f", language {lang}"
    missing = [c for c in task.required_columns() if c not in dataset.column_names]
    if missing:
        raise DataError(
            f"{where}: missing column(s) {', '.join(missing)} needed by task {task.name!r}; "
            f"it has: {', '.join(dataset.column_names)}"
        )
    rows = task.language_rows(dataset, lang, where)
    if rows is not None:
        dataset = dataset.select(rows)
    positions = rows if rows is not None else range(len(dataset))  # the source row of each row, for messages
    check_rows(task, dataset, where, positions)
    dataset = task.check_split(dataset, where, positions)
    if len(dataset) == 0:
        raise DataError(f"{where}: no rows")
    if split == "train":  # a warning names the task, the language and the file: it does not stop the run
        warn_suspicious_rows(task, dataset, f"task {task.name!r} language {lang}, {describe_read(ref, sources)}")
    logger.info(f"loaded {where}: {len(dataset)} rows" + (f", using {limit}" if limit and limit < len(dataset) else ""))
    return (dataset.select(range(limit)) if limit is not None and limit < len(dataset) else dataset), where


def _all_texts(tasks: dict[str, TaskData]) -> list[str]:
    texts: list[str] = []
    for td in tasks.values():
        for ds in [*td.raw_train.values(), *td.raw_eval.values()]:
            texts.extend(td.task.texts(ds))
    return texts


def encode_split(td: TaskData, dataset: datasets.Dataset, where: str, tokenizer: Any) -> datasets.Dataset:
    """``dataset``, a split of ``td``'s task read from ``where``, tokenised (cached by content: the rows, the task's
    encoding, its labels, the length and the tokenizer)."""
    task, max_length, label_names = td.task, td.max_length, td.label_names

    def encode(batch: dict[str, list], rows: list[int]) -> dict[str, list]:  # rows checked: mtft.data.checks
        return task.encode_rows(batch, rows, tokenizer, max_length, label_names, where)

    fingerprint = hashlib.sha256(
        json.dumps(
            [
                ENCODING_VERSION,
                dataset._fingerprint,
                task.encoding_key(),
                label_names,
                max_length,
                _tokenizer_digest(tokenizer),
            ]
        ).encode()
    ).hexdigest()[:32]
    encoded = dataset.map(
        encode, batched=True, with_indices=True, remove_columns=dataset.column_names, new_fingerprint=fingerprint
    )
    if "id" in encoded.column_names and encoded.features["id"] != datasets.Value("string"):
        # datasets gives an output column the type of the input column of its name: the encoded ids, strings (the
        # task's example_ids), would become a user's integer "id" column's numbers
        encoded = encoded.cast_column("id", datasets.Value("string"))
    warn_unknown_pieces(encoded, getattr(tokenizer, "unk_token_id", None), where)
    return encoded


def _tokenizer_digest(tokenizer: Any) -> str:
    """A content hash of the tokenizer, part of the tokenisation cache key."""
    if not hasattr(tokenizer, "_mtft_digest"):
        tokenizer._mtft_digest = hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()).hexdigest()
    return tokenizer._mtft_digest


def _objective_key(mode: str) -> Callable[[Objective], str]:
    return {"task_language": lambda o: o.key, "task": lambda o: o.task, "language": lambda o: o.language}[mode]


def _group(units: list[Objective], mode: str) -> tuple[list[str], list[int]]:
    """Map training units to loss objectives: per (task, language), per task or per language."""
    key = _objective_key(mode)
    names: list[str] = []
    for unit in units:
        if key(unit) not in names:
            names.append(key(unit))
    return names, [names.index(key(unit)) for unit in units]
