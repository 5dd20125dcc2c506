"""Rebuild a finished (or interrupted) run's model from its directory, without its data.

A run writes ``encoder/`` (the encoder's config and the tokenizer) when it starts, and every checkpoint holds
the full weights plus ``heads.json`` and ``trainer_state.json``; together with ``config.yaml`` that is all it
takes to rebuild :class:`MultiTaskModel` -- for export, scoring and probes, which all restore through
:func:`load_run` (given the run directory or one of its checkpoint folders), so that a model is rebuilt one way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from safetensors.torch import load_file
from transformers import AutoConfig, AutoModel, AutoTokenizer

from mtft.adapters import AdapterMethod, build_method
from mtft.config import load_config
from mtft.config.schema import RunConfig
from mtft.core.errors import CheckpointError, UserError
from mtft.models.multihead import collapse_stacked_heads
from mtft.models.multitask import MultiTaskModel
from mtft.tasks.kinds import build_head
from mtft.training.checkpoint import MARKER, latest_checkpoint

ENCODER_DIR = "encoder"


@dataclass
class LoadedRun:
    config: RunConfig
    model: MultiTaskModel
    tokenizer: Any
    heads: dict[str, dict[str, Any]]  # task -> {"kind", "label_names"}
    objectives: list[str]  # loss objectives, in their index order
    checkpoint: Path
    method: AdapterMethod  # model.adapter.method, applied to model.encoder
    run_dir: Path


def save_encoder_files(run_dir: Path, encoder, tokenizer) -> None:
    """What :func:`load_run` needs besides a checkpoint: the encoder's config and the tokenizer."""
    folder = run_dir / ENCODER_DIR
    encoder.config.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))


def find_run_dir(folder: Path) -> tuple[Path, Optional[Path]]:
    """(run directory, checkpoint) of ``folder``: a run directory itself (no checkpoint named), or one of its
    checkpoint folders (``<run>/checkpoints/step-N``, ``<run>/best``) with the run directory above it."""
    folder = Path(folder)
    if (folder / "config.yaml").is_file():
        return folder, None
    if (folder / "model.safetensors").is_file():
        for run_dir in (folder.parent, folder.parent.parent):
            if (run_dir / "config.yaml").is_file():
                return run_dir, folder
    raise CheckpointError(f"{folder} is not an mtft run directory (no config.yaml)")


def load_run(run_dir: Path, checkpoint: Optional[Path] = None) -> LoadedRun:
    """The model of ``run_dir`` with the weights of ``checkpoint`` (default: its newest complete one).
    ``run_dir`` may also be a checkpoint folder of a run, whose weights are then loaded."""
    run_dir, found = find_run_dir(run_dir)
    checkpoint = checkpoint or found
    if not (run_dir / ENCODER_DIR / "config.json").is_file():
        raise CheckpointError(f"{run_dir} has no {ENCODER_DIR}/config.json (written when a run starts)")
    checkpoint = Path(checkpoint) if checkpoint else latest_checkpoint(run_dir)
    if checkpoint is None:
        raise CheckpointError(f"{run_dir} has no complete checkpoint")
    if not (checkpoint / "model.safetensors").is_file() or not (checkpoint / "heads.json").is_file():
        raise CheckpointError(f"{checkpoint} is not a checkpoint (needs model.safetensors and heads.json)")
    if checkpoint.parent.name == "checkpoints" and not (checkpoint / MARKER).is_file():
        raise CheckpointError(f"{checkpoint} is incomplete (no {MARKER} marker)")
    try:
        config = load_config(run_dir / "config.yaml")
    except UserError as error:
        raise CheckpointError(f"{run_dir}/config.yaml: {error}") from None
    heads = json.loads((checkpoint / "heads.json").read_text())
    objectives = _objectives(run_dir, checkpoint)
    encoder = AutoModel.from_config(AutoConfig.from_pretrained(str(run_dir / ENCODER_DIR)))
    if getattr(encoder, "pooler", None) is not None:
        encoder.pooler = None  # as in training (mtft.models.backbone)
    method = build_method(config.model.adapter)
    method.apply(encoder, list(heads), objectives, config.run.seed)  # rows are routed by their head's task
    model = MultiTaskModel(
        encoder,
        {
            task: build_head(meta["kind"], encoder.config.hidden_size, meta["label_names"], 0.0)
            for task, meta in heads.items()
        },
        num_objectives=len(objectives),
    )
    # a training checkpoint of an MHLoss run keeps all H heads; the loaded model predicts with their average
    state = collapse_stacked_heads(load_file(str(checkpoint / "model.safetensors")), model.state_dict())
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise CheckpointError(
            f"{checkpoint}/model.safetensors does not fit the run's model: missing {sorted(missing)[:3]}, "
            f"unexpected {sorted(unexpected)[:3]}"
        )
    tokenizer = AutoTokenizer.from_pretrained(str(run_dir / ENCODER_DIR))
    return LoadedRun(config, model.eval(), tokenizer, heads, objectives, checkpoint, method, run_dir)


def _objectives(run_dir: Path, checkpoint: Path) -> list[str]:
    if not (checkpoint / "trainer_state.json").is_file():  # best/ holds none; a run's objectives never change
        checkpoint = latest_checkpoint(run_dir)
        if checkpoint is None:
            raise CheckpointError(f"{run_dir}: no checkpoint with a trainer_state.json to read the objectives from")
    return list(json.loads((checkpoint / "trainer_state.json").read_text())["objectives"])
