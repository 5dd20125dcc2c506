"""Multiple-choice tasks (SuperGLUE COPA): one encoded row per example holding one sequence per choice.

Each choice becomes the pair (context, choice); the ``multiple_choice`` head scores every pair and normalises
over the example's choices. The label is the index of the right choice, and the label names (COPA's ClassLabel:
``choice1``, ``choice2``) name the choices in the order of ``choice_columns``; the prediction is that name.

Settings (in the task file or ``data.tasks.N.settings``)::

    choice_columns: [choice1, choice2]                # one column per choice, in label order
    context_template: "{premise} What was the {question}?"   # str.format over the row's columns
    choice_template: "{choice}"                        # {choice} is the choice's text

Templates hold plain ``{column}`` placeholders only (:mod:`mtft.core.templates`): checked when the settings are
read, their columns checked against each split, filled without ``str.format``.

COPA's question is ``cause`` or ``effect``; the template turns it into words, as jiant's COPA does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence

import datasets
from pydantic import BaseModel, ConfigDict, Field, field_validator

from mtft.core.errors import DataError
from mtft.core.templates import check_template, fill_template
from mtft.tasks.base import SEGMENTS, Task
from mtft.tasks.columns import column_values


class ChoiceSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    choice_columns: list[str] = Field(
        default_factory=list, description="The columns holding the choices, in the order of the label names."
    )
    context_template: Optional[str] = Field(
        None,
        description="First segment of every pair, a template of {column} placeholders over the row's columns "
        "(e.g. '{premise} What was the {question}?'); default: the text columns joined by a space.",
    )
    choice_template: str = Field("{choice}", description="Second segment; {choice} is the choice's text.")

    @field_validator("context_template", "choice_template")
    @classmethod
    def _plain_placeholders(cls, value: Optional[str]) -> Optional[str]:
        if value is not None:
            check_template(value, None, None)  # the columns are known with the split (check_split)
        return value


@dataclass
class MultipleChoiceTask(Task):
    head: str = "multiple_choice"

    Settings = ChoiceSettings

    def required_columns(self) -> list[str]:
        return [*super().required_columns(), *self.options.choice_columns]

    def texts(self, dataset: datasets.Dataset) -> Iterator[str]:
        yield from super().texts(dataset)
        for column in self.options.choice_columns:
            yield from (v for v in column_values(dataset, column) if isinstance(v, str))

    def resolve_label_names(self, dataset: datasets.Dataset) -> list[str]:
        names = super().resolve_label_names(dataset)
        choices = self.options.choice_columns
        if len(choices) < 2 or len(names) != len(choices):
            raise DataError(
                f"task {self.name!r}: settings.choice_columns {choices} must name one column per label "
                f"({len(names)}: {', '.join(names)}), at least two"
            )
        return names

    def check_split(self, dataset: datasets.Dataset, where: str, rows: Sequence[int]) -> datasets.Dataset:
        """Every template field must be a column of the split (checked once, before encoding)."""
        options = self.options
        for name, template in (
            ("context_template", options.context_template),
            ("choice_template", options.choice_template),
        ):
            fields = set(check_template(template or "", None, f"settings.{name}"))
            unknown = fields - set(dataset.column_names) - ({"choice"} if name == "choice_template" else set())
            if unknown:
                raise DataError(
                    f"{where}: task {self.name!r}: settings.{name} {template!r} names unknown "
                    f"column(s) {', '.join(sorted(unknown))}; columns: {', '.join(dataset.column_names)}"
                )
        return dataset

    def encode_rows(
        self,
        batch: dict[str, list],
        rows: list[int],
        tokenizer: Any,
        max_length: int,
        label_names: Sequence[str],
        where: str,
    ) -> dict[str, list]:
        options = self.options
        count = len(rows)
        records = [{column: values[i] for column, values in batch.items()} for i in range(count)]
        contexts = [
            fill_template(options.context_template, r, "settings.context_template")
            if options.context_template
            else " ".join(str(r[c]) for c in self.text_columns)
            for r in records
        ]
        firsts, seconds = [], []
        for context, record in zip(contexts, records):
            for column in options.choice_columns:
                firsts.append(context)
                choice = {**record, "choice": record[column]}
                seconds.append(fill_template(options.choice_template, choice, "settings.choice_template"))
        encoded = tokenizer(firsts, seconds, truncation=True, max_length=max_length)
        width = len(options.choice_columns)
        out = {
            "labels": self.label_ids(batch[self.label_column], label_names, where, rows),
            "id": self.example_ids(batch, rows),
        }
        for column in ("input_ids", SEGMENTS) if SEGMENTS in encoded else ("input_ids",):
            out[column] = [encoded[column][i * width : (i + 1) * width] for i in range(count)]
        return out
