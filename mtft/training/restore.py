"""Rebuild a finished (or interrupted) run's model from its directory, without its data: the one run loader.

A run writes ``encoder/`` (the encoder's config and the tokenizer) when it starts, and every checkpoint holds
the full weights plus ``heads.json`` and ``trainer_state.json``; together with ``config.yaml`` that is all it
takes to rebuild :class:`MultiTaskModel` -- for predict, evaluate, export, scoring and probes, which all restore
through :func:`load_run` (given the run directory or one of its checkpoint folders), so that a model is rebuilt
one way, and a run folder is read one way:

- **which weights**: :func:`resolve_checkpoint` -- ``best/`` where the run kept one, else its newest complete
  checkpoint, the same default for every command;
- **pinned**: the checkpoint's files are opened together before any is read, so a training run that rotates
  its checkpoints (or replaces ``best/``) meanwhile cannot pull them away; a checkpoint chosen by default that
  vanished before its files were open is resolved again (:data:`ROTATION_RETRIES` times);
- **no code run** from the folder and **one line** per damaged or edited file (:mod:`mtft.models.folders`).
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterator, Optional, Union

from safetensors.torch import load, load_file

from mtft.adapters import AdapterMethod
from mtft.config.run_config import RunConfig
from mtft.core.atomic import is_complete
from mtft.core.errors import CheckpointError, UserError, shorten
from mtft.core.registry import plugin_code
from mtft.models.folders import folder_tokenizer, reading
from mtft.models.multihead import collapse_stacked_heads
from mtft.models.multitask import MultiTaskModel
from mtft.runs import ENCODER_DIR, read_run_config, rebuild_model
from mtft.training.checkpoint import MARKER, latest_checkpoint

RUN_CONFIG = "the run folder (config.yaml, tasks/)"  # what names a run's plug-in code, for the refusal (plugin_code)
BEST = "best"
ROTATION_RETRIES = 5  # a default checkpoint resolved again after training rotated it away this many times


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


CHECKPOINT_HELP = (
    "best (the default where the run kept one, else its newest complete checkpoint), latest (the newest complete "
    "checkpoint), or a checkpoint folder (step-00000120, or a path)"
)


def resolve_checkpoint(run_dir: Path, name: Union[str, Path, None] = None) -> Path:
    """The checkpoint folder of ``run_dir`` that ``name`` means (see :data:`CHECKPOINT_HELP`); ``run_dir`` may be a
    checkpoint folder itself, which is then the default."""
    root, found = find_run_dir(run_dir)
    if name is None and found is not None:
        return found
    if name is None or str(name) == BEST:
        if is_complete(root / BEST) or (name is None and (root / BEST / "model.safetensors").is_file()):
            return root / BEST
        if name is not None:
            raise CheckpointError(f"{root} kept no best checkpoint (evaluation.metric_for_best unset?); {_kept(root)}")
    if name is None or str(name) == "latest":
        newest = latest_checkpoint(root)
        if newest is None:
            raise CheckpointError(f"{root} has no complete checkpoint")
        return newest
    for candidate in (root / str(name), root / "checkpoints" / str(name), Path(name)):
        if (candidate / "model.safetensors").is_file():
            return candidate
    raise CheckpointError(f"{root} has no checkpoint {shorten(str(name))!r}; {_kept(root)}")


def _kept(root: Path) -> str:
    kept = sorted(p.name for p in (root / "checkpoints").glob("step-*")) + ([BEST] if (root / BEST).is_dir() else [])
    return f"it has: {', '.join(kept) or 'none'}"


def load_run(run_dir: Path, checkpoint: Union[str, Path, None] = None, trust_plugins: bool = False) -> LoadedRun:
    """The model of ``run_dir`` with the weights of ``checkpoint`` (see :func:`resolve_checkpoint`; default: best/,
    else the newest complete checkpoint). ``run_dir`` may also be a checkpoint folder of a run, whose weights are
    then loaded. Every problem of the folder is one :class:`CheckpointError` line naming the file. Plug-in code
    that the run's config names (an adapter method, weighting or task class by ``module:Class``) is imported only
    with ``trust_plugins`` (:func:`mtft.core.registry.plugin_code`)."""
    with plugin_code(trust_plugins, RUN_CONFIG):
        return _load_run(run_dir, checkpoint)


def _load_run(run_dir: Path, checkpoint: Union[str, Path, None]) -> LoadedRun:
    root, found = find_run_dir(run_dir)
    chosen_by_default = checkpoint is None and found is None or str(checkpoint) in (BEST, "latest")
    for attempt in range(ROTATION_RETRIES + 1):
        folder = resolve_checkpoint(run_dir, checkpoint)
        try:
            with _pinned(root, folder) as files:
                return _rebuild(root, folder, files)
        except FileNotFoundError as exc:
            if folder.exists():
                raise CheckpointError(f"{exc.filename or folder}: missing") from None
            if not chosen_by_default or attempt == ROTATION_RETRIES:
                raise CheckpointError(
                    f"{folder} was removed while it was being loaded (a training run rotating its checkpoints?); "
                    "name a newer one, or wait for the run to end"
                ) from None
    raise AssertionError("unreachable")


@contextlib.contextmanager
def _pinned(root: Path, checkpoint: Path) -> Iterator[dict[str, IO[bytes]]]:
    """The files a rebuild reads, opened together (a file open stays readable when its folder is deleted).
    FileNotFoundError where one is gone."""
    checks = [
        (root / "config.yaml", "the run's config"),
        (root / ENCODER_DIR / "config.json", "written when a run starts"),
    ]
    for path, what in checks:
        if not path.is_file():
            raise CheckpointError(f"{path} is missing ({what})")
    if not checkpoint.is_dir():
        raise FileNotFoundError(checkpoint)
    if checkpoint.parent.name == "checkpoints" and not (checkpoint / MARKER).is_file():
        raise CheckpointError(f"{checkpoint} is incomplete (no {MARKER} marker)")
    state = checkpoint if (checkpoint / "trainer_state.json").is_file() else latest_checkpoint(root)
    if state is None:  # best/ holds none; a run's objectives never change, any checkpoint's state names them
        raise CheckpointError(f"{root}: no checkpoint with a trainer_state.json to read the objectives from")
    paths = {
        "model": checkpoint / "model.safetensors",
        "heads": checkpoint / "heads.json",
        "state": state / "trainer_state.json",
    }
    with contextlib.ExitStack() as stack:
        files = {}
        for key, path in paths.items():
            if not path.is_file() and checkpoint.exists() and (key != "state" or state.exists()):
                raise CheckpointError(f"{checkpoint} is not a checkpoint: {path.name} is missing")
            files[key] = stack.enter_context(open(path, "rb"))
        yield files


def _rebuild(root: Path, checkpoint: Path, files: dict[str, IO[bytes]]) -> LoadedRun:
    try:
        config = read_run_config(root)
    except UserError as error:
        raise CheckpointError(f"{root}/config.yaml: {error}") from None
    heads = _heads(checkpoint / "heads.json", files["heads"])
    with reading(Path(files["state"].name)):
        objectives = [str(name) for name in _json(files["state"])["objectives"]]
    model, method = rebuild_model(root, config, heads, objectives, checkpoint / "heads.json")
    weights = checkpoint / "model.safetensors"
    with reading(weights):
        saved = _safetensors(files["model"])
    # a training checkpoint of an MHLoss run keeps all H heads; the loaded model predicts with their average
    with reading(
        f"{weights} does not fit the run's model (config.yaml or encoder/ edited, or weights of another run?)"
    ):
        state = collapse_stacked_heads(saved, model.state_dict())
        missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise CheckpointError(
            f"{weights} does not fit the run's model (weights of another run?): missing {sorted(missing)[:3]}, "
            f"unexpected {sorted(unexpected)[:3]}"
        )
    tokenizer = folder_tokenizer(root / ENCODER_DIR)
    return LoadedRun(config, model.eval(), tokenizer, heads, objectives, checkpoint, method, root)


def _heads(path: Path, handle: IO[bytes]) -> dict[str, dict[str, Any]]:
    with reading(path):
        heads = _json(handle)
    fine = (
        isinstance(heads, dict)
        and heads
        and all(
            isinstance(meta, dict) and isinstance(meta.get("kind"), str) and isinstance(meta.get("label_names"), list)
            for meta in heads.values()
        )
    )
    if not fine:
        raise CheckpointError(f"{path}: expected an object of task: {{kind, label_names}}")
    return heads


def _json(handle: IO[bytes]) -> Any:
    """The JSON in an open file (read_json reads by name; a pinned file may no longer have one)."""
    try:
        return json.loads(handle.read().decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None
    except ValueError as exc:
        raise ValueError(f"not JSON ({exc})") from None


def _safetensors(handle: IO[bytes]) -> dict:
    """The tensors of an open safetensors file: memory-mapped through ``/proc/self/fd`` where the system has it
    (the file stays readable after rotation deleted its name), else read whole."""
    by_descriptor = f"/proc/self/fd/{handle.fileno()}"
    if os.path.exists(by_descriptor):
        return load_file(by_descriptor)
    return load(handle.read())
