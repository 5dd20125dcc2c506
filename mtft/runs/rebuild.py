"""A run's model rebuilt from its folder: the encoder from its saved config, the adapter method applied, one
head per ``heads.json`` entry -- the structure only; the caller loads the weights it needs into it."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

import torch
from transformers import AutoModel, PretrainedConfig

from mtft.adapters import AdapterMethod, build_method
from mtft.config.run_config import RunConfig
from mtft.models.folders import folder_config, reading
from mtft.models.multitask import MultiTaskModel
from mtft.tasks.kinds import HEAD_CLASSES, build_head
from mtft.tasks.registry import discover_tasks

ENCODER_DIR = "encoder"


def plain_encoder(config: PretrainedConfig) -> torch.nn.Module:
    """A freshly initialised encoder of ``config`` as training builds it: without the pooler (unused by every
    head; training drops it too, :mod:`mtft.models.backbone`)."""
    encoder = AutoModel.from_config(config)
    if getattr(encoder, "pooler", None) is not None:
        encoder.pooler = None
    return encoder


def rebuild_model(
    run_dir: Path,
    config: RunConfig,
    heads: Mapping[str, Mapping[str, Any]],
    objectives: Sequence[str],
    heads_file: Path,
    device: Optional[Union[str, torch.device]] = None,
) -> tuple[MultiTaskModel, AdapterMethod]:
    """The model of the run in ``run_dir`` (trained with ``config``; ``heads`` as the checkpoint's ``heads_file``
    lists them, ``objectives`` as its trainer state does), built on ``device`` (``"meta"``: shapes only, nothing
    allocated).

    A head of a kind mtft does not ship was enrolled by its task's plug-in module: that task is loaded first
    (from the run's own task copies, under the run's plug-in gate) so that the kind is known here.
    """
    run_dir = Path(run_dir)
    encoder_dir = run_dir / ENCODER_DIR
    encoder_config = folder_config(encoder_dir)  # refuses an auto_map before anything loads
    with reading(f"{run_dir}/tasks (the run's task definitions)"):
        _enrol_head_kinds(config, heads)
    with torch.device(device) if device is not None else nullcontext():
        with reading(encoder_dir / "config.json"):
            encoder = plain_encoder(encoder_config)
        with reading(f"{run_dir}/config.yaml (model.adapter)"):
            method = build_method(config.model.adapter)
            method.apply(encoder, list(heads), list(objectives), config.run.seed)  # rows routed by head's task
        with reading(heads_file):
            built = {
                task: build_head(meta["kind"], encoder.config.hidden_size, meta["label_names"], 0.0)
                for task, meta in heads.items()
            }
        model = MultiTaskModel(encoder, built, num_objectives=len(objectives))
    return model, method


def _enrol_head_kinds(config: RunConfig, heads: Mapping[str, Mapping[str, Any]]) -> None:
    unknown = [task for task, meta in heads.items() if meta.get("kind") not in HEAD_CLASSES]
    if unknown:
        catalog = discover_tasks(config.data.task_dirs)
        for task in unknown:
            if task in catalog:
                catalog[task]  # builds the task, importing its plug-in
