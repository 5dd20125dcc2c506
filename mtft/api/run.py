"""A finished run, used: its model predicts a task on new input in any language.

Prediction goes through exactly the code a run's own evaluation uses -- the task's encoding, the batch builder,
the model's ``predict_logits`` (adapters routed by task, or by the trained objective where there is one), the
head's ``decode`` and the task's ``postprocess`` -- so that predicting a run's evaluation split reproduces its
``predictions/`` files. Each row adds what the logits say beyond the prediction: class probabilities for
classification and multiple choice, entity spans for token classification, the answer's character offsets in its
context for extractive QA (``answer_start``, ``answer_end``; null for the empty answer).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence, Union

import datasets
import torch
from tqdm import tqdm

from mtft.api.inputs import from_records, load_input, prepare_input
from mtft.config.schema import RunConfig
from mtft.core.errors import CheckpointError, ConfigError
from mtft.data.batching import BatchBuilder
from mtft.data.pipeline import Objective, PreparedData, TaskData, _encode, _objective_key
from mtft.data.selection import SelectedTask, select_tasks
from mtft.evaluation.evaluate import batch_logits
from mtft.training.restore import LoadedRun, find_run_dir
from mtft.training.restore import load_run as restore_run

UNNAMED = "input"  # the language of rows given without one (adapters kept per task route them all the same)


def load_run(run_dir: Union[str, Path], checkpoint: Optional[str] = None) -> "TrainedRun":
    """The run in ``run_dir`` with the weights of ``checkpoint``: ``best`` (the default where the run kept one,
    else its newest complete checkpoint), ``latest``, a checkpoint's folder name (``step-00000120``) or path."""
    return TrainedRun(restore_run(*_checkpoint(Path(run_dir), checkpoint)))


def _checkpoint(run_dir: Path, name: Optional[str]) -> tuple[Path, Optional[Path]]:
    root, found = find_run_dir(run_dir)
    if found is not None or name == "latest":
        return root, found
    if name is None:
        return root, root / "best" if (root / "best" / "model.safetensors").is_file() else None
    for candidate in (root / name, root / "checkpoints" / name, Path(name)):
        if (candidate / "model.safetensors").is_file():
            return root, candidate
    kept = sorted(p.name for p in (root / "checkpoints").glob("step-*")) + (
        ["best"] if (root / "best").is_dir() else []
    )
    raise CheckpointError(f"{root} has no checkpoint {name!r}; it has: {', '.join(kept) or 'none'}")


def read_input(
    config: RunConfig, task: str, source: str, split: str = "test", language: Optional[str] = None
) -> tuple[datasets.Dataset, str]:
    """(rows, where they came from) of ``source`` for ``task`` of the run whose config is ``config``: a
    .jsonl/.json/.csv/.parquet file, a Hub id or a local dataset folder (then its ``split``, and the task's config
    for ``language``), checked against the task's columns (:mod:`mtft.api.inputs`) -- without its model."""
    chosen = {c.name: c for c in select_tasks(config)}.get(task)
    if chosen is None:
        raise ConfigError(
            f"task {task!r} is not a task of this run; its tasks: {', '.join(t.name for t in config.data.tasks)}"
        )
    data = config.data
    dataset, where = load_input(chosen.task, source, split, language, chosen.protocol, data.sources, data.cache_dir)
    return prepare_input(chosen.task, dataset, where), where


def unknown_task(task: str, tasks: list[str]) -> ConfigError:
    return ConfigError(f"task {task!r} is not a task of this run; its tasks: {', '.join(tasks)}")


class TrainedRun:
    """A run's model, tokenizer and tasks (see :func:`load_run`)."""

    def __init__(self, loaded: LoadedRun):
        self.loaded = loaded
        self.config = loaded.config
        self.tasks: dict[str, SelectedTask] = {chosen.name: chosen for chosen in select_tasks(loaded.config)}

    @property
    def run_dir(self) -> Path:
        return self.loaded.run_dir

    def task(self, name: str) -> SelectedTask:
        if name not in self.tasks:
            raise ConfigError(
                f"task {name!r} is not a task of the run {self.run_dir}; its tasks: {', '.join(self.tasks)}"
            )
        return self.tasks[name]

    def label_names(self, task: str) -> list[str]:
        return list(self.loaded.heads[self.task(task).task.evaluate_with or task]["label_names"])

    # ----- prediction --------------------------------------------------------------------------------
    def predict(
        self,
        task: str,
        rows: Union[Sequence[Any], datasets.Dataset],
        language: Optional[str] = None,
        batch_size: Optional[int] = None,
        progress: bool = False,
        where: Optional[str] = None,
    ) -> list[dict[str, Any]]:
        """Predictions for ``rows`` (texts, dicts of the task's columns, or a dataset, e.g. from
        :func:`read_input`), one dict per example in their order: ``id``, ``prediction`` (as the run's
        predictions files hold it) and the extras."""
        chosen = self.task(task)
        dataset = rows if isinstance(rows, datasets.Dataset) else from_records(rows, chosen.task)
        where = where or f"task {task!r} input"
        return self._predict(chosen, dataset, language or UNNAMED, where, batch_size, progress)

    def predict_input(
        self, task: str, source: str, language: Optional[str] = None, split: str = "test", **options: Any
    ) -> list[dict[str, Any]]:
        """Predictions for ``source`` (see :func:`read_input`); ``options`` as :meth:`predict` takes them."""
        dataset, where = read_input(self.config, task, source, split, language)
        return self.predict(task, dataset, language, where=where, **options)

    def _predict(
        self, chosen: SelectedTask, raw: datasets.Dataset, language: str, where: str, batch_size, progress: bool
    ) -> list[dict[str, Any]]:
        task, run = chosen.task, self.loaded
        head = task.evaluate_with or task.name
        raw = prepare_input(task, raw, where)
        data = self._data(chosen, raw, language, where)
        td = data.tasks[task.name]
        builder, objective = BatchBuilder(data), Objective(task.name, language)
        size = batch_size or self.config.evaluation.batch_size
        outputs: list = []
        probabilities: list = []
        decoder = run.model.heads[head]
        with torch.no_grad():
            for index in tqdm(
                range(builder.eval_batch_count(task.name, language, size)),
                desc=f"predict {task.name}",
                disable=not progress,
                dynamic_ncols=True,
            ):
                logits, context = batch_logits(run.model, data, builder, objective, size, index, "cpu", False)
                outputs += decoder.decode(logits, **context)
                probabilities += _probabilities(task.head, decoder, logits, context)
        encoded = td.eval[language]
        spans: dict = {}
        if task.head == "question_answering":  # the answers and their spans from one search
            by_id, spans = task.answers(outputs, encoded, raw)
        else:
            by_id = task.postprocess(outputs, encoded, raw, td.label_names)
        extra = dict(zip(encoded["id"], probabilities)) if probabilities else {}
        words = dict(zip(task.split_ids(raw), raw[task.text_columns[0]])) if task.head == "token_classification" else {}
        results = []
        for key in task.split_ids(raw):
            row: dict[str, Any] = {"id": key, "prediction": by_id[key]}
            if key in extra:
                row["probabilities"] = dict(zip(td.label_names, extra[key]))
            if key in words:
                row["entities"] = entities(by_id[key], words[key])
            if key in spans:  # the answer's character offsets in its context (null: the empty answer)
                span = spans[key]
                row["answer_start"], row["answer_end"] = span if span else (None, None)
            results.append(row)
        return results

    def _data(self, chosen: SelectedTask, raw: datasets.Dataset, language: str, where: str) -> PreparedData:
        """The run's data layout holding ``raw`` (encoded) as the evaluation rows of (task, language)."""
        task, run, config = chosen.task, self.loaded, self.config
        tasks: dict[str, TaskData] = {}
        for name in dict.fromkeys(
            [task.evaluate_with or task.name, task.name]
        ):  # a borrowed head's owner, then the task
            other = self.tasks[name]
            tasks[name] = TaskData(
                other.task,
                other.protocol,
                [language] if name == task.name else [],
                max_length=other.selection.max_length or config.data.max_length,
                eval_split=UNNAMED,
                label_names=self.label_names(name),
            )
        td = tasks[task.name]
        td.raw_eval[language], td.origin[UNNAMED, language] = raw, where
        td.eval[language] = _encode(td, raw, where, run.tokenizer, config)
        key = _objective_key(config.weighting.objectives)
        head = task.evaluate_with or task.name
        name = key(Objective(head, language))
        routed = {(head, language): run.objectives.index(name)} if name in run.objectives else {}
        return PreparedData(tasks, run.tokenizer, [], [], list(run.objectives), routed)


def _probabilities(kind: str, head, logits, context) -> list[list[float]]:
    """Per example, the softmax over its classes (or choices); none for the other kinds."""
    if kind == "sequence_classification":
        return logits.softmax(-1).tolist()
    if kind == "multiple_choice":
        return head.choice_matrix(logits, context["group_index"]).softmax(-1).tolist()
    return []


def entities(tags: Sequence[str], words: Sequence[str]) -> list[dict[str, Any]]:
    """The entity spans of a BIO tag sequence (word positions, end exclusive): ``B-X`` opens one, ``I-X`` of the
    same type continues it (an ``I-X`` after anything else opens one too, as seqeval's default mode reads it)."""
    spans: list[dict[str, Any]] = []
    for n, tag in enumerate(tags):
        prefix, _, kind = tag.partition("-")
        if prefix == "I" and spans and spans[-1]["type"] == kind and spans[-1]["end"] == n:
            spans[-1]["end"] = n + 1
        elif prefix in ("B", "I") and kind:
            spans.append({"type": kind, "start": n, "end": n + 1})
    for span in spans:
        span["text"] = " ".join(words[span["start"] : span["end"]])
    return spans
