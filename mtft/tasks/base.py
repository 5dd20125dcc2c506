"""The task API.

A task knows where its data lives (per split, language and protocol), how to turn rows into encoded model
rows with labels, which head it needs, how to turn the head's raw outputs back into predictions per example,
and how to score them. Simple tasks are declared in a YAML file (see :mod:`mtft.tasks.declarative` and
``tasks/README.md``); tasks that need code subclass :class:`Task` or one of the kinds in :mod:`mtft.tasks.kinds`.

The life of a split: ``dataset_ref`` -> ``datasets.load_dataset`` -> :meth:`Task.language_rows` ->
:meth:`Task.check_split` -> :meth:`Task.encode_rows` (``datasets.map``, cached; one source row may become
several encoded rows) -> batches -> head -> :meth:`Task.postprocess` (encoded rows back to examples, keyed by
example id) -> :meth:`Task.compute_metrics` against :meth:`Task.references`.

This base class is sequence classification (one encoded row per example, one class id per row).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator, Mapping, Optional, Sequence

import datasets
from pydantic import BaseModel, ConfigDict, ValidationError

from mtft.core.errors import ConfigError, DataError, echo, shorten
from mtft.core.templates import fill_template
from mtft.tasks.columns import column_values
from mtft.tasks.hidden import HIDDEN_ENCODED, check_not_hidden, is_hidden

#: Segment ids in encoded rows, kept wherever the tokenizer writes them (BERT: 0 for the first text of a pair, 1
#: for the second; XLM-R's tokenizer writes none); the batch builder hands them to the encoder.
SEGMENTS = "token_type_ids"


class NoSettings(BaseModel):
    """A task kind without settings."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class DatasetRef:
    """Where one split of one language comes from: ``datasets.load_dataset(path, name, split=split)``.

    ``path`` is a Hub id, a local folder in the Hub layout, or a packaged builder (``json``, ``csv``,
    ``parquet``) with ``data_files``. ``language`` fixes the language of every row (e.g. MultiNLI is English).
    """

    path: str
    split: str
    name: Optional[str] = None
    data_files: Optional[Any] = None
    language: Optional[str] = None

    def describe(self) -> str:
        config = f" (config {self.name})" if self.name else ""
        return f"{self.path}{config} split {self.split}"


@dataclass
class Task:
    """Base class of every task (sequence classification). Subclasses override the hooks that differ."""

    name: str
    languages: Sequence[str]
    head: str = "sequence_classification"
    source_language: str = "en"
    default_protocol: str = "zero_shot"
    label_column: str = "label"
    text_columns: Sequence[str] = ()
    id_column: Optional[str] = None
    label_names: Optional[Sequence[str]] = None
    metrics: Sequence[str] = ("accuracy",)
    description: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    # language -> prefix of its example ids, for datasets that hold every language in one split
    # (TyDiQA-GoldP: {ar: arabic, ...} selects the rows whose id starts with "arabic-").
    language_id_prefixes: dict[str, str] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)  # validated by the kind's Settings model
    # the label value that marks a withheld label (GLUE/SuperGLUE test sets on the Hub: -1), see mtft.tasks.hidden
    hidden_label: Any = None
    # an evaluation-only task predicted with the head another task of the run trains (GLUE AX: glue_mnli)
    evaluate_with: Optional[str] = None
    folder: Optional[str] = None

    protocols: ClassVar[tuple[str, ...]] = ("zero_shot", "in_language")
    Settings: ClassVar[type[BaseModel]] = NoSettings
    # what each text column holds: "text" (a string per row) or "words" (a list of strings); mtft.data.checks
    # refuses a column of anything else before the tokenizer sees it
    text_value: ClassVar[str] = "text"

    # ----- settings ------------------------------------------------------------------------------------
    @property
    def options(self) -> BaseModel:
        """The validated settings (defaults filled in)."""
        return self.Settings(**self.settings)

    def configured(self, overrides: Mapping[str, Any], where: str) -> "Task":
        """A copy with ``overrides`` (e.g. ``data.tasks.N.settings``) applied and validated."""
        merged = {**self.settings, **dict(overrides)}
        try:
            validated = self.Settings(**merged)
        except ValidationError as exc:
            valid = (
                ", ".join(
                    f"{k} ({f.description})" if f.description else k for k, f in self.Settings.model_fields.items()
                )
                or "none"
            )
            problems = "; ".join(
                f"settings.{'.'.join(map(str, e['loc']))}: {shorten(e['msg'])}"
                + ("" if isinstance(e.get("input"), (dict, list)) else f" (got {echo(e.get('input'))})")
                for e in exc.errors()
            )
            raise ConfigError(f"{where}: task {self.name!r}: {problems}; valid settings: {valid}") from None
        return dataclasses.replace(self, settings=validated.model_dump())

    def available_metrics(self) -> tuple[str, ...]:
        """The metric names this task kind can compute (a task file's ``metrics`` must be among them)."""
        from mtft.metrics.common import METRICS

        return tuple(METRICS)

    # ----- where the data lives -------------------------------------------------------------------
    def dataset_ref(self, split: str, language: str, protocol: str) -> DatasetRef:
        """The data of ``split`` for ``language`` under ``protocol``."""
        entry = self.data.get(split)
        if entry is None:
            raise DataError(f"task {self.name!r} has no split {split!r}; it has: {', '.join(self.data)}")
        if isinstance(entry, dict) and protocol in entry and isinstance(entry[protocol], dict):
            entry = entry[protocol]
        what = f"task {self.name!r}: data.{split}"
        fields = {
            k: (fill_template(v, {"language": language}, f"{what}.{k}") if isinstance(v, str) else v)
            for k, v in entry.items()
        }
        return DatasetRef(**fields)

    def training_languages(self, languages: Sequence[str], protocol: str) -> list[str]:
        if self.evaluate_with is not None:
            return []  # evaluation-only: predicted by the head of the task it names
        return [self.source_language] if protocol == "zero_shot" else list(languages)

    def language_rows(self, dataset: datasets.Dataset, language: str, where: str) -> Optional[list[int]]:
        """The row numbers of ``language`` in ``dataset``; None: every row (the dataset is one language's).

        Tasks that take the language from an id prefix (``language_id_prefixes``) select the matching rows."""
        if not self.language_id_prefixes:
            return None
        if self.id_column is None or language not in self.language_id_prefixes:
            raise ConfigError(f"task {self.name!r}: language_id_prefixes needs id_column and an entry for {language!r}")
        prefix = f"{self.language_id_prefixes[language]}-"
        keep = [i for i, value in enumerate(column_values(dataset, self.id_column)) if str(value).startswith(prefix)]
        if not keep:
            raise DataError(f"{where}: no rows of language {language!r} (ids starting with {prefix!r})")
        return keep

    def check_split(self, dataset: datasets.Dataset, where: str, rows: Sequence[int]) -> datasets.Dataset:
        """Validate (and, where the kind says so, drop and report) rows before encoding. Default: as is.

        ``rows`` gives the row number in the source split of each row of ``dataset``, for messages."""
        return dataset

    # ----- rows -> encoded rows ---------------------------------------------------------------------
    def required_columns(self) -> list[str]:
        return [*self.text_columns, self.label_column, *([self.id_column] if self.id_column else [])]

    def texts(self, dataset: datasets.Dataset) -> Iterator[str]:
        """The text of ``dataset``, for training the ``tiny`` tokenizer (word lists are joined by spaces)."""
        for column in self.text_columns:
            for value in column_values(dataset, column):
                if isinstance(value, str):
                    yield value
                elif isinstance(value, list) and all(isinstance(v, str) for v in value):
                    yield " ".join(value)

    def resolve_label_names(self, dataset: datasets.Dataset) -> list[str]:
        """Label names from the dataset's ClassLabel feature (also inside a sequence), else the task's own."""
        feature = dataset.features.get(self.label_column)
        inner = getattr(feature, "feature", None)  # Sequence(ClassLabel) / List(ClassLabel): per-token labels
        for candidate in (feature, inner):
            if isinstance(candidate, datasets.ClassLabel):
                return list(candidate.names)
        if self.label_names:
            return list(self.label_names)
        raise DataError(
            f"task {self.name!r}: column {self.label_column!r} is not a ClassLabel and the task declares no label_names"
        )

    def encode(self, batch: dict[str, list], tokenizer: Any, max_length: int) -> Any:
        """Tokenise a batch of rows (``datasets.map(batched=True)``)."""
        texts = [batch[c] for c in self.text_columns]
        return tokenizer(*texts, truncation=True, max_length=max_length)

    def encode_rows(
        self,
        batch: dict[str, list],
        rows: list[int],
        tokenizer: Any,
        max_length: int,
        label_names: Sequence[str],
        where: str,
    ) -> dict[str, list]:
        """Source rows -> encoded rows: ``input_ids``, ``labels`` (the head's form), ``id`` (the example id,
        shared by every encoded row of one example), plus any column :meth:`postprocess` needs.

        ``input_ids`` of a row may be a list of C sequences (multiple choice); the batch builder then makes C
        encoder rows of it (see ``tasks/README.md``)."""
        encoded = {k: list(v) for k, v in self.encode(batch, tokenizer, max_length).items()}
        encoded["labels"] = self.label_ids(batch[self.label_column], label_names, where, rows)
        encoded["id"] = self.example_ids(batch, rows)
        return encoded

    def example_ids(self, batch: dict[str, list], rows: Sequence[int]) -> list[str]:
        """Example ids: the id column, or the row number in the split."""
        return [str(i) for i in (batch[self.id_column] if self.id_column else rows)]

    def label_ids(self, values: list, label_names: Sequence[str], where: str, rows: Sequence[int]) -> list[int]:
        """Map label values (ids or names) to ids, rejecting anything out of range (a withheld label: no loss)."""
        index = {name: i for i, name in enumerate(label_names)}
        out = []
        for row, value in zip(rows, values):
            if is_hidden(self, value):
                out.append(HIDDEN_ENCODED)
            elif isinstance(value, str) and value in index:
                out.append(index[value])
            elif isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(label_names):
                out.append(value)
            else:
                raise DataError(
                    f"{where}: row {row}: label {value!r} is out of range; valid labels: "
                    f"{', '.join(f'{i}={n}' for i, n in enumerate(label_names))}"
                )
        return out

    def encoding_key(self) -> str:
        """What the encoding depends on besides the data and the tokenizer: part of the cache fingerprint.

        The task's fields and settings, and the source of its class (an edited subclass re-encodes)."""
        fields = {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("description", "folder")
        }
        return json.dumps([type(self).__qualname__, _source_digest(type(self)), fields], sort_keys=True, default=str)

    # ----- predictions and metrics -------------------------------------------------------------------
    def postprocess(
        self, outputs: list, encoded: datasets.Dataset, raw: datasets.Dataset, label_names: Sequence[str]
    ) -> dict[str, Any]:
        """The head's raw outputs (one per encoded row, in order) -> example id -> prediction (natural form).

        ``encoded`` holds the encoded rows (with any extra column :meth:`encode_rows` wrote), ``raw`` the split's
        source rows (the text that predictions map back to)."""
        return dict(zip(encoded["id"], outputs))

    def prediction_rows(
        self, outputs: list, encoded: datasets.Dataset, raw: datasets.Dataset, label_names: Sequence[str]
    ) -> dict[str, dict[str, Any]]:
        """Example id -> the fields ``run.py predict`` writes for it beside its id: ``prediction`` (the natural
        form of :meth:`postprocess`) and whatever else the kind can say of it (token classification: the entity
        spans; extractive QA: the answer's character offsets)."""
        return {
            key: {"prediction": value} for key, value in self.postprocess(outputs, encoded, raw, label_names).items()
        }

    def placeholder_label(self, row: Any) -> Any:
        """A label of this task's form for an input ``row`` given without one, that encodes without error and that
        prediction never reads (here: class 0)."""
        return 0

    def references(self, raw: datasets.Dataset, label_names: Sequence[str], where: str) -> dict[str, Any]:
        """Example id -> reference in the task's natural form (here: the label name), in the split's order."""
        values = column_values(raw, self.label_column)
        check_not_hidden(self, values, where)
        labels = self.label_ids(values, label_names, where, range(len(raw)))
        return unique_by_id(self.split_ids(raw), [label_names[i] for i in labels], where)

    def split_ids(self, raw: datasets.Dataset) -> list[str]:
        """The example id of every row of a split (as :meth:`example_ids` gives them)."""
        return self.example_ids(
            {self.id_column: column_values(raw, self.id_column)} if self.id_column else {}, range(len(raw))
        )

    def check_prediction(self, prediction: Any, reference: Any, label_names: Sequence[str]) -> Optional[str]:
        """Why ``prediction`` is malformed (None when it is fine): here it must be one of the label names."""
        if not isinstance(prediction, str) or prediction not in label_names:
            return f"prediction {prediction!r} is not a label name; valid: {', '.join(label_names)}"
        return None

    def compute_metrics(self, predictions: Sequence, references: Sequence) -> dict[str, float]:
        from mtft.metrics.common import compute

        return {name: compute(name, predictions, references) for name in self.metrics}

    def metric_description(self) -> str:
        """The metric variant, in words, for the report."""
        return ", ".join(self.metrics)

    # ----- the majority-class baseline -------------------------------------------------------------
    def majority_prediction(
        self, train: Sequence[datasets.Dataset], label_names: Sequence[str], where: str
    ) -> Optional[Any]:
        """The majority-class baseline's prediction, the same for every example: the most frequent label of the
        training splits ``train`` (all languages pooled: one head predicts every language; a tie goes to the label
        listed first), in the form :meth:`postprocess` gives (here a label name). None where the task kind has
        no class to predict for every example (spans, per-token tags, numbers, candidates): those kinds override
        this to return None. Withheld labels are not counted."""
        counts = [0] * len(label_names)
        for dataset in train:
            for label in self.label_ids(
                column_values(dataset, self.label_column), label_names, where, range(len(dataset))
            ):
                if label != HIDDEN_ENCODED:
                    counts[label] += 1
        if not any(counts):
            return None
        return label_names[counts.index(max(counts))]


def unique_by_id(ids: Sequence[str], values: Sequence[Any], where: str) -> dict[str, Any]:
    """``dict(zip(ids, values))``, refusing a duplicate id (naming its row)."""
    out: dict[str, Any] = {}
    for row, (key, value) in enumerate(zip(ids, values)):
        if key in out:
            raise DataError(f"{where}: row {row}: duplicate example id {key!r}")
        out[key] = value
    return out


@functools.lru_cache(maxsize=None)
def _source_digest(task_class: type) -> str:
    """A digest of the source of ``task_class`` and its bases, once per class and process: ``inspect.getsource``
    of a class parses its whole module (~0.1 s), and a run asks once for every split it encodes."""
    sources = []
    for cls in task_class.__mro__:
        if cls is object:
            continue
        try:
            sources.append(inspect.getsource(cls))
        except (OSError, TypeError):
            sources.append(cls.__qualname__)
    return hashlib.sha256("\n".join(sources).encode()).hexdigest()[:16]
