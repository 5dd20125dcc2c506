"""Task-file copies with edits, for the task-definition tests (TyDiQA's fixture as a task of one's own)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.helpers.launch import REPO

SOURCES = {
    "unimelb-nlp/wikiann": str(REPO / "tasks/wikiann/fixtures/wikiann"),
    "google-research-datasets/tydiqa": str(REPO / "tasks/tydiqa/fixtures/tydiqa"),
}


def write_tydiqa_copy(tmp_path: Path, mutate) -> Path:
    folder = tmp_path / "tydiqa"
    shutil.copytree(SOURCES["google-research-datasets/tydiqa"], folder)
    path = folder / "secondary_task/validation.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    mutate([r for r in rows if r["id"].startswith("english-")])
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return folder
