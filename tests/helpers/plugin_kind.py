"""A task kind added from outside the library: one module beside its task file -- a Task and a Head class and one
``register_kind`` call -- and the task file naming it (``nli_tempered``, XNLI's data), for the tests that train one."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.helpers.runs import xnli_task_spec

KIND_MODULE = '''
from dataclasses import dataclass

from mtft.models.heads import SequenceClassificationHead
from mtft.tasks.base import Task
from mtft.tasks.kinds import register_kind


class TemperedHead(SequenceClassificationHead):
    """A classifier whose probabilities are a softmax at temperature 2."""

    kind = "tempered_classification"

    def probabilities(self, logits, **context):
        return (logits / 2.0).softmax(-1).tolist()


@dataclass
class IndexedTask(Task):
    """Sequence classification whose predicted rows also give the label's index."""

    head: str = "tempered_classification"

    def prediction_rows(self, outputs, encoded, raw, label_names):
        rows = super().prediction_rows(outputs, encoded, raw, label_names)
        for row in rows.values():
            row["label_index"] = list(label_names).index(row["prediction"])
        return rows


register_kind("tempered_classification", IndexedTask, TemperedHead)
'''


def write_kind_task(folder: Path) -> Path:
    """``folder`` with the kind's module and the task file of ``nli_tempered`` (en, de) that uses it."""
    folder.mkdir(parents=True)
    (folder / "tempered_kind.py").write_text(KIND_MODULE)
    spec = xnli_task_spec(
        "nli_tempered", ["en", "de"], head="tempered_classification", **{"class": "tempered_kind:IndexedTask"}
    )
    (folder / "nli_tempered.yaml").write_text(yaml.safe_dump(spec))
    return folder
