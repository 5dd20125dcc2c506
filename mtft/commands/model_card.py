"""The model card (``README.md``) of every exported folder: what a user of the Hub expects to read before loading it.

Its YAML header is the Hub's metadata (``library_name``, ``base_model`` where the base is a model others can load by
that name, ``pipeline_tag``, ``language``, ``datasets``, ``tags``, ``license`` where mtft knows the backbone's);
its body says what was trained on what: the base model and revision, the task and its labels, the source languages
(trained on) and the targets (zero-shot), the adapter and the weighting, ``max_length``, the checkpoint, the
per-language metrics of that checkpoint's evaluation, how to load the folder, and the command that trains it again.
It replaces PEFT's empty template in an adapter's folder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import yaml

from mtft.models.named_backbones import HUB_IDS
from mtft.training.restore import LoadedRun

PIPELINES = {
    "sequence_classification": "text-classification",
    "regression": "text-classification",
    "token_classification": "token-classification",
    "question_answering": "question-answering",
    "multiple_choice": "multiple-choice",
}
LICENCES = {"multilingual-e5-small": "mit"}  # the licences mtft knows of the backbones it names itself


def checkpoint_metrics(run: LoadedRun) -> tuple[dict[str, Any], str]:
    """The evaluation of the exported weights: the checkpoint's own metrics.json (best/ keeps the one it was chosen
    by), else the run's final one; and which it is."""
    for path, what in ((run.checkpoint / "metrics.json", run.checkpoint.name), (run.run_dir / "metrics.json", "final")):
        if path.is_file():
            try:
                return json.loads(path.read_text(encoding="utf-8")), what
            except ValueError:
                continue
    return {}, "none"


def model_card(run: LoadedRun, task: str, base_ref: str, library: str, how_to_load: str) -> str:
    config = run.config
    selected = (
        next(t for t in config.data.tasks if t.name == task) if any(t.name == task for t in config.data.tasks) else None
    )
    languages = list(selected.languages or []) if selected else []
    sources = list(selected.source_languages or []) if selected and selected.source_languages else []
    targets = [lang for lang in languages if sources and lang not in sources]
    meta = run.heads[task]
    kind, labels = meta["kind"], meta["label_names"]
    metrics, evaluated = checkpoint_metrics(run)
    backbone = config.model.backbone
    header: dict[str, Any] = {"library_name": library}
    if base_ref == backbone and base_ref != "tiny":
        header["base_model"] = HUB_IDS.get(base_ref, base_ref)
    if kind in PIPELINES:
        header["pipeline_tag"] = PIPELINES[kind]
    if languages:
        header["language"] = languages
    if backbone in LICENCES:
        header["license"] = LICENCES[backbone]
    header["tags"] = ["mtft", config.model.adapter.method, config.weighting.method, task]
    adapter = config.model.adapter
    options = adapter.options.model_dump() if adapter.options is not None else {}
    weighting = config.weighting.method + (f" {config.weighting.options}" if config.weighting.options else "")
    rows = [
        ("base model", f"{backbone}" + (f" (revision {config.model.revision})" if config.model.revision else "")),
        ("task", f"{task} ({kind})" + (f": {', '.join(map(str, labels))}" if labels else "")),
        ("trained on", ", ".join(sources or languages) or "–"),
        ("zero-shot targets", ", ".join(targets) or "none"),
        ("adapter", f"{adapter.method}" + (f" {options}" if options else "")),
        ("weighting", f"{weighting} over {config.weighting.objectives} objectives"),
        ("max_length", str(selected.max_length if selected and selected.max_length else config.data.max_length)),
        ("checkpoint", f"{run.checkpoint.name} of {run.run_dir.name}"),
        ("licence", LICENCES.get(backbone, "the base model's (see its card)")),
    ]
    lines = ["---", yaml.safe_dump(header, sort_keys=False, allow_unicode=True).rstrip(), "---", ""]
    lines += [f"# {config.run.name}: {task}", "", f"Fine-tuned with mtft from `{backbone}`.", ""]
    lines += ["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows] + [""]
    lines += _metrics_table(task, languages, targets, metrics, evaluated)
    lines += ["## How to load", "", "```python", how_to_load.strip(), "```", ""]
    lines += [
        "## Trained with",
        "",
        f"`python run.py --config config.yaml`, the run's own `config.yaml` ({run.run_dir.name}/config.yaml).",
        "",
    ]
    return "\n".join(lines)


def _metrics_table(
    task: str, languages: list[str], targets: list[str], metrics: dict[str, Any], evaluated: str
) -> list[str]:
    names = sorted(
        {
            k.rsplit("/", 1)[1]
            for k in metrics
            if k.startswith(f"{task}/") and k.count("/") == 2 and "majority_" not in k
        }
    )
    if not names:
        return []
    lines = [f"## Evaluation ({evaluated}, step {metrics.get('step', '?')})", ""]
    lines += ["| language | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for lang in languages or sorted(
        {k.split("/")[1] for k in metrics if k.startswith(f"{task}/") and k.count("/") == 2}
    ):
        role = " (target)" if lang in targets else ""
        cells = [_fmt(metrics.get(f"{task}/{lang}/{m}")) for m in names]
        lines.append(f"| {lang}{role} | " + " | ".join(cells) + " |")
    return lines + [""]


def _fmt(value: Optional[float]) -> str:
    return "–" if not isinstance(value, (int, float)) else f"{value:.4f}"


def write_card(folder: Path, text: str) -> None:
    (Path(folder) / "README.md").write_text(text, encoding="utf-8")
