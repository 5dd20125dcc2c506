"""The task API.

A task knows where its data lives (per split, language and protocol), how to turn rows into model inputs,
which head it needs, and how to score predictions. Simple tasks are declared in a YAML file (see
:mod:`mtft.tasks.declarative` and ``tasks/README.md``); tasks that need code subclass :class:`Task`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional, Sequence

import datasets

from mtft.errors import DataError


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
    """Base class of every task. Subclasses override the hooks that differ."""

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
    folder: Optional[str] = None

    protocols: ClassVar[tuple[str, ...]] = ("zero_shot", "in_language")

    # ----- where the data lives -------------------------------------------------------------------
    def dataset_ref(self, split: str, language: str, protocol: str) -> DatasetRef:
        """The data of ``split`` for ``language`` under ``protocol``."""
        entry = self.data.get(split)
        if entry is None:
            raise DataError(f"task {self.name!r} has no split {split!r}; it has: {', '.join(self.data)}")
        if isinstance(entry, dict) and protocol in entry and isinstance(entry[protocol], dict):
            entry = entry[protocol]
        fields = {k: (v.format(language=language) if isinstance(v, str) else v) for k, v in entry.items()}
        return DatasetRef(**fields)

    def training_languages(self, languages: Sequence[str], protocol: str) -> list[str]:
        return [self.source_language] if protocol == "zero_shot" else list(languages)

    # ----- rows -> model inputs ---------------------------------------------------------------------
    def required_columns(self) -> list[str]:
        return [*self.text_columns, self.label_column]

    def resolve_label_names(self, dataset: datasets.Dataset) -> list[str]:
        """Label names from the dataset's ClassLabel feature, else from the task definition."""
        feature = dataset.features.get(self.label_column)
        if isinstance(feature, datasets.ClassLabel):
            return list(feature.names)
        if self.label_names:
            return list(self.label_names)
        raise DataError(
            f"task {self.name!r}: column {self.label_column!r} is not a ClassLabel and the task declares "
            "no label_names"
        )

    def encode(self, batch: dict[str, list], tokenizer: Any, max_length: int) -> dict[str, list]:
        """Tokenise a batch of rows (``datasets.map(batched=True)``)."""
        texts = [batch[c] for c in self.text_columns]
        return tokenizer(*texts, truncation=True, max_length=max_length)

    def label_ids(
        self, values: list, label_names: Sequence[str], where: str, rows: Sequence[int]
    ) -> list[int]:
        """Map label values (ids or names) to ids, rejecting anything out of range."""
        index = {name: i for i, name in enumerate(label_names)}
        out = []
        for row, value in zip(rows, values):
            if isinstance(value, str) and value in index:
                out.append(index[value])
            elif isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(label_names):
                out.append(value)
            else:
                raise DataError(
                    f"{where}: row {row}: label {value!r} is out of range; valid labels: "
                    f"{', '.join(f'{i}={n}' for i, n in enumerate(label_names))}"
                )
        return out

    # ----- predictions and metrics -------------------------------------------------------------------
    def compute_metrics(self, predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
        from mtft.evaluation.metrics import compute

        return {name: compute(name, predictions, references) for name in self.metrics}
