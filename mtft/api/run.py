"""A finished run, used: its model predicts a task on new input in any language.

Prediction goes through exactly the code a run's own evaluation uses -- the task's encoding, the batch builder,
the model's ``predict_logits`` (adapters routed by task, or by the trained objective where there is one), the
head's ``decode`` and the task's ``postprocess`` -- so that predicting a run's evaluation split reproduces its
``predictions/`` files. Each row adds what the logits say beyond the prediction: class probabilities for
classification and multiple choice, entity spans for token classification, the answer's character offsets in its
context for extractive QA (``answer_start``, ``answer_end``; null for the empty answer).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence, Union

import datasets
import torch
from tqdm import tqdm

from mtft.api.inputs import from_records, load_input, prepare_input
from mtft.config.run_config import RunConfig
from mtft.core.errors import CheckpointError, ConfigError, DataError, shorten
from mtft.core.output import OutputPolicy
from mtft.core.registry import plugin_code
from mtft.data.batching import BatchBuilder
from mtft.data.pipeline import Objective, PreparedData, TaskData, _objective_key, encode_split
from mtft.data.selection import SelectedTask, select_tasks
from mtft.evaluation.evaluate import batch_logits
from mtft.tasks.base import Task
from mtft.training.restore import RUN_CONFIG, LoadedRun, find_run_dir
from mtft.training.restore import load_run as restore_run

CHUNK_ROWS = 1024  # rows encoded and predicted at a time: memory is flat in the number of rows
UNNAMED = "input"  # the language of rows given without one (adapters kept per task route them all the same)


def load_run(
    run_dir: Union[str, Path], checkpoint: Union[str, Path, None] = None, trust_plugins: bool = False
) -> "TrainedRun":
    """The run in ``run_dir`` with the weights of ``checkpoint``: ``best`` (the default where the run kept one,
    else its newest complete checkpoint), ``latest``, a checkpoint's folder name (``step-00000120``) or path.
    Plug-in code its config names is imported only with ``trust_plugins``; no code in the folder ever runs."""
    with plugin_code(trust_plugins, RUN_CONFIG):
        return TrainedRun(restore_run(Path(run_dir), checkpoint, trust_plugins))


def output_policy(*folders: Union[str, Path], inputs: Sequence[Union[str, Path]] = ()) -> OutputPolicy:
    """Where a command that writes from runs (predict, evaluate, export, probe) may write: never inside the run
    of any of ``folders`` (run or checkpoint folders it reads), never over one of them or of its ``inputs``
    (:mod:`mtft.core.output`). Checked before anything is read: a folder that is not a run is refused when it
    loads, in its own line."""
    runs = []
    for folder in folders:
        with contextlib.suppress(CheckpointError):
            runs.append(find_run_dir(Path(folder))[0])
    return OutputPolicy("--out", inputs=[*folders, *inputs], runs=runs)


def read_input(
    config: RunConfig, task: str, source: str, split: str = "test", language: Optional[str] = None
) -> tuple[datasets.Dataset, str]:
    """(rows, where they came from) of ``source`` for ``task`` of the run whose config is ``config``: a
    .jsonl/.json/.csv/.parquet file, a Hub id or a local dataset folder (then its ``split``, and the task's config
    for ``language``), checked against the task's columns (:mod:`mtft.api.inputs`) -- without its model."""
    chosen = {c.name: c for c in select_tasks(config.data, config.evaluation.split)}.get(task)
    if chosen is None:
        raise ConfigError(
            f"task {task!r} is not a task of this run; its tasks: {', '.join(t.name for t in config.data.tasks)}"
        )
    if language is not None and language not in chosen.task.languages:
        known = ", ".join(chosen.task.languages)
        raise ConfigError(
            f"--language {shorten(language)!r}: task {task!r} has no such language; its languages: {known}"
        )
    data = config.data
    dataset, where = load_input(chosen.task, source, split, language, chosen.protocol, data.sources, data.cache_dir)
    prepare_input(chosen.task, in_memory(dataset, 0, CHUNK_ROWS), where)  # columns and the first rows, early
    return dataset, where


def unknown_task(task: str, tasks: list[str]) -> ConfigError:
    return ConfigError(f"task {task!r} is not a task of this run; its tasks: {', '.join(tasks)}")


class TrainedRun:
    """A run's model, tokenizer and tasks (see :func:`load_run`)."""

    def __init__(self, loaded: LoadedRun):
        self.loaded = loaded
        self.config = loaded.config
        self.tasks: dict[str, SelectedTask] = {
            chosen.name: chosen for chosen in select_tasks(loaded.config.data, loaded.config.evaluation.split)
        }

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
        :func:`read_input`), one dict per row in their order: ``id``, ``prediction`` (as the run's predictions
        files hold it) and the extras. See :meth:`iter_predict` for rows too many to hold."""
        return list(self.iter_predict(task, rows, language, batch_size, progress, where))

    def iter_predict(
        self,
        task: str,
        rows: Union[Sequence[Any], datasets.Dataset],
        language: Optional[str] = None,
        batch_size: Optional[int] = None,
        progress: bool = False,
        where: Optional[str] = None,
        chunk_rows: Optional[int] = None,
    ) -> Iterator[dict[str, Any]]:
        """:meth:`predict`, row by row, ``chunk_rows`` rows encoded at a time: memory does not grow with the
        number of rows (a dataset from :func:`read_input` stays on disk). Each row keeps the input's own id (the
        task's id column, else an ``id`` column, else the row number) and is answered as its own, whatever its id:
        repeated ids get one answer each."""
        with quiet_datasets():  # the library's "Map" and "Flattening the indices" bars are not the caller's
            yield from self._iter_predict(task, rows, language, batch_size, progress, where, chunk_rows)

    def _iter_predict(self, task, rows, language, batch_size, progress, where, chunk_rows) -> Iterator[dict[str, Any]]:
        chosen = self.task(task)
        dataset = rows if isinstance(rows, datasets.Dataset) else from_records(rows, chosen.task)
        where = where or f"task {task!r} input"
        size = chunk_rows or CHUNK_ROWS
        bar = tqdm(total=len(dataset), desc=f"predict {task}", disable=not progress, dynamic_ncols=True, unit="row")
        with bar:
            for start in range(0, len(dataset), size):
                chunk = in_memory(dataset, start, size)
                ids = input_ids(chosen.task, chunk, start) if plain_ids(chosen.task) else None
                answered = self._predict(
                    chosen, own_ids(chosen.task, chunk, start), language or UNNAMED, where, batch_size, start
                )
                if len(answered) != len(chunk):  # a task that drops rows it cannot read (never with new input)
                    raise DataError(
                        f"{where}: rows {start}-{start + len(chunk) - 1}: the task answered "
                        f"{len(answered)} of {len(chunk)}"
                    )
                for n, row in enumerate(answered):
                    yield {**row, "id": ids[n]} if ids is not None else row
                bar.update(len(chunk))

    def predict_input(
        self, task: str, source: str, language: Optional[str] = None, split: str = "test", **options: Any
    ) -> list[dict[str, Any]]:
        """Predictions for ``source`` (see :func:`read_input`); ``options`` as :meth:`predict` takes them."""
        dataset, where = read_input(self.config, task, source, split, language)
        return self.predict(task, dataset, language, where=where, **options)

    def _predict(
        self, chosen: SelectedTask, raw: datasets.Dataset, language: str, where: str, batch_size, offset: int
    ) -> list[dict[str, Any]]:
        """One row per row of ``raw`` (rows ``offset``... of the input), in order; ids are the task's."""
        task, run = chosen.task, self.loaded
        head = task.evaluate_with or task.name
        raw = prepare_input(task, raw, where, offset)
        data = self._data(chosen, raw, language, where)
        td = data.tasks[task.name]
        builder, objective = BatchBuilder(data), Objective(task.name, language)
        size = batch_size or self.config.evaluation.batch_size
        outputs: list = []
        probabilities: list = []
        decoder = run.model.heads[head]
        with torch.no_grad():
            for index in range(builder.eval_batch_count(task.name, language, size)):
                logits, context = batch_logits(run.model, data, builder, objective, size, index, "cpu", False)
                outputs += decoder.decode(logits, **context)
                probabilities += decoder.probabilities(logits, **context)
        encoded = td.eval[language]
        fields = task.prediction_rows(outputs, encoded, raw, td.label_names)
        extra = dict(zip(encoded["id"], probabilities)) if probabilities else {}
        results = []
        for key in task.split_ids(raw):
            row: dict[str, Any] = {"id": key, "prediction": fields[key]["prediction"]}
            if key in extra:
                row["probabilities"] = dict(zip(td.label_names, extra[key]))
            row.update(fields[key])  # what else the task's kind says of the row (entities, answer offsets)
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
        td.eval[language] = encode_split(td, raw, where, run.tokenizer)
        key = _objective_key(config.weighting.objectives)
        head = task.evaluate_with or task.name
        name = key(Objective(head, language))
        routed = {(head, language): run.objectives.index(name)} if name in run.objectives else {}
        return PreparedData(tasks, run.tokenizer, [], [], list(run.objectives), routed)


@contextlib.contextmanager
def quiet_datasets() -> Iterator[None]:
    """The ``datasets`` library's progress bars off for the block, and as they were after it."""
    quiet = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if not quiet:
            datasets.enable_progress_bars()


def in_memory(dataset: datasets.Dataset, start: int, size: int) -> datasets.Dataset:
    """Rows ``start``..``start + size`` of ``dataset`` as a dataset in memory: encoding it writes no cache file."""
    return dataset.select(range(start, min(start + size, len(dataset)))).flatten_indices(keep_in_memory=True)


def plain_ids(task: Task) -> bool:
    """Whether ``task``'s example ids are its id column's values as they are (or the row numbers): not structured
    indices that the task reads with an ``example_ids`` of its own (SuperGLUE's MultiRC and ReCoRD)."""
    return type(task).example_ids is Task.example_ids


def input_ids(task: Task, rows: datasets.Dataset, offset: int) -> list[Any]:
    """The ids a user gave ``rows`` (rows ``offset``... of the input), as given (an integer stays an integer): the
    task's id column, else a column ``id``, else the row numbers (as strings, like the ids of a run's predictions
    files)."""
    for column in (task.id_column, "id"):
        if column and column in rows.column_names:
            return list(rows[column])
    return [str(offset + n) for n in range(len(rows))]


def own_ids(task: Task, rows: datasets.Dataset, offset: int) -> datasets.Dataset:
    """``rows`` with ids of the task's form that tell every row apart (the row numbers), so that two rows with
    one id are still answered as two (:func:`input_ids` gives them their own ids back). A task whose ids are
    structured (SuperGLUE's MultiRC and ReCoRD indices, read by its own ``example_ids``) keeps its ids: its
    checks refuse repeated ones."""
    if task.id_column is None or not plain_ids(task):
        return rows
    if task.id_column in rows.column_names:
        rows = rows.remove_columns(task.id_column)
    return rows.add_column(task.id_column, [str(offset + n) for n in range(len(rows))])
