"""What a run checks and builds before it trains: output directory, tokenizer, model, shared parameters."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch
import yaml

from mtft.adapters import AdapterMethod, build_method
from mtft.config.load import load_config
from mtft.config.paths import cache_dir
from mtft.config.run_config import RunConfig
from mtft.config.schema import ModelSection
from mtft.core.atomic import AtomicFolder, marker
from mtft.core.errors import ConfigError
from mtft.data.pipeline import PreparedData
from mtft.models.backbone import build_encoder
from mtft.models.checkpointing import enable_checkpointing
from mtft.models.heads import PooledHead
from mtft.models.mixout import apply_mixout
from mtft.models.multitask import MultiTaskModel
from mtft.models.tokenizer import load_backbone_tokenizer, tiny_tokenizer
from mtft.tasks.kinds import build_head, head_class
from mtft.training import checkpoint as ckpt
from mtft.training.standalone import absolute_paths, check_task_files_unchanged

# Keys that may differ between an interrupted run and its resumption.
_RESUME_FREE_KEYS = {("run", "resume"), ("run", "overwrite"), ("logging", "progress_bar")}


def make_tokenizer_factory(config: RunConfig, model: Optional[ModelSection] = None):
    """``model``: the model section fine-tuning starts from (``config.model`` with its backbone resolved)."""
    model = model or config.model
    if model.backbone == "tiny":
        return lambda texts: tiny_tokenizer(texts, model.tiny.vocab_size, cache_dir(config.data))
    return lambda texts: load_backbone_tokenizer(model.backbone, model.revision, model.trust_remote_code)


def build_model(config: RunConfig, data: PreparedData, model: Optional[ModelSection] = None) -> MultiTaskModel:
    """``model``: the model section fine-tuning starts from (``config.model`` with its backbone resolved)."""
    # the backbone's weights follow pretrain.seed; everything fine-tuning initialises follows run.seed
    encoder = build_encoder(model or config.model, data.tokenizer, config.data.longest_row, config.pretrain.seed)
    torch.manual_seed(config.run.seed)
    method = build_method(config.model.adapter)
    if method.routing == "objective":
        untrained = [o.key for o in data.eval_objectives() if (o.task, o.language) not in data.eval_objective]
        if untrained:
            raise ConfigError(
                "model.adapter.granularity=objective gives every loss objective its own adapter, but the evaluated "
                f"{', '.join(untrained[:5])} {'is' if len(untrained) == 1 else 'are'} not trained "
                "(zero-shot): use granularity=task, or train every evaluated language (the in_language protocol, "
                "no data.tasks.N.source_languages)"
            )
    # a row is routed by the task whose head predicts it (an evaluation-only task borrows its owner's adapter)
    method.apply(encoder, data.head_tasks(), data.objective_names, config.run.seed)
    # Mixout mixes towards the weights the run starts from (θ_p); the heads keep model.classifier_dropout
    if apply_mixout(encoder, config.stability.mixout) == 0 and config.stability.mixout > 0:
        raise ConfigError(
            f"stability.mixout={config.stability.mixout}: model.adapter.method={config.model.adapter.method} "
            "leaves no trainable linear layer in the encoder to apply Mixout to"
        )
    if config.training.gradient_checkpointing:
        enable_checkpointing(encoder)
    heads = {
        name: build_head(td.task.head, encoder.config.hidden_size, td.label_names, config.model.classifier_dropout)
        for name, td in data.tasks.items()
        if name in data.head_tasks()
    }
    check_mhloss(config.stability.heads, {name: data.tasks[name].task.head for name in heads})
    for head in heads.values():  # after every plain head is built: H = 1 draws exactly what plain fine-tuning draws
        if isinstance(head, PooledHead):
            head.use_heads(config.stability.heads)
    return MultiTaskModel(encoder, heads, num_objectives=len(data.objective_names), mmr=config.stability.mmr)


def check_mhloss(heads: int, kinds: dict[str, str]) -> None:
    """MHLoss (``stability.heads`` > 1) multiplies the final linear layer of the pooled heads (sequence
    classification, regression, multiple choice, candidate scoring); token classification and extractive QA
    heads are refused rather than silently trained with one head."""
    if heads <= 1:
        return
    refused = {name: kind for name, kind in kinds.items() if not issubclass(head_class(kind), PooledHead)}
    if refused:
        name, kind = next(iter(refused.items()))
        raise ConfigError(
            f"stability.heads={heads} (MHLoss) supports pooled heads only; task {name!r} has a {kind} head: "
            "set stability.heads=1 or leave that task out"
        )


def heads_metadata(data: PreparedData) -> dict[str, Any]:
    return {
        name: {"kind": td.task.head, "label_names": td.label_names}
        for name, td in data.tasks.items()
        if name in data.head_tasks()
    }


def shared_parameters(
    model: MultiTaskModel, data: PreparedData, mode: str, method: AdapterMethod
) -> tuple[list[torch.nn.Parameter], dict[torch.nn.Parameter, torch.Tensor]]:
    """The parameters whose per-objective gradients form the Gram (``weighting.shared``), and for parameters
    stacked over the method's routing slots (:meth:`~mtft.adapters.AdapterMethod.shared_rows`) the rows that count.

    ``auto``: those that more than one objective can update -- every encoder weight, a task's head when several
    objectives (its languages) use it, and a routed adapter likewise (with one adapter per objective, none is
    shared). With ``weighting.objectives: task`` the heads and task adapters are private.
    """
    objectives_of_task: dict[str, set[int]] = {}
    for unit, objective in zip(data.train_units, data.unit_objective):
        objectives_of_task.setdefault(unit.task, set()).add(objective)
    # task slots are the tasks that own a head, in head order: rows are routed by their head's index
    routed = method.shared_rows(
        model, [len(objectives_of_task.get(task, ())) for task in model.heads], len(data.objective_names)
    )
    shared, only_rows = [], {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        is_head = name.startswith("heads.")
        if mode == "all" or (mode == "encoder" and not is_head):
            shared.append(param)
        elif mode == "auto" and param in routed:
            if len(routed[param]):
                shared.append(param)
                only_rows[param] = routed[param]
        elif mode == "auto":
            users = len(objectives_of_task.get(name.split(".")[1], ())) if is_head else len(data.objective_names)
            if users > 1:
                shared.append(param)
    return shared, only_rows


def check_output_dir(config: RunConfig) -> Optional[Path]:
    """Refuse an output directory that holds something else; return the checkpoint to resume from."""
    run_dir = Path(config.run.output_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"run.output_dir {run_dir} is a file, not a directory; choose another run.output_dir")
    if not resumes_existing_run(config):
        AtomicFolder(run_dir).check()  # the run directory is written as <dir>.partial: not over a folder of the user's
    if not run_dir.exists() or not any(run_dir.iterdir()):
        return None
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        raise ConfigError(
            f"output directory {run_dir} is not empty and holds no mtft run; choose another run.output_dir"
        )
    if config.run.overwrite and not config.run.resume:
        # only a folder mtft provably wrote (its completeness marker says "run") is ever replaced: a config.yaml
        # alone proves nothing, and overwrite deletes the whole folder
        if marker(run_dir).get("kind") != "run":
            raise ConfigError(
                f"run.overwrite=true: {run_dir} is not an mtft run directory (no COMPLETE marker of kind 'run'), so "
                "it is not replaced; choose another run.output_dir"
            )
        return None
    if not config.run.resume:
        raise ConfigError(
            f"output directory {run_dir} holds another run; set run.resume=true to continue it, "
            "run.overwrite=true to replace it, or choose another run.output_dir"
        )
    # the saved config records its paths absolute (mtft.training.standalone); so is this one, to compare
    differences = _config_differences(_saved_config(saved), absolute_paths(config).model_dump(mode="json"))
    if differences:
        raise ConfigError(f"cannot resume {run_dir}: the config differs at {', '.join(differences[:5])}")
    check_task_files_unchanged(run_dir, config)
    return ckpt.latest_checkpoint(run_dir)


def resumes_existing_run(config: RunConfig) -> bool:
    """Whether this run continues the run in its output directory (which it then leaves as it is) rather than
    writing a new one."""
    return config.run.resume and (Path(config.run.output_dir) / "config.yaml").is_file()


def _saved_config(saved: Path) -> Any:
    """The interrupted run's config as this version reads it: keys added since take their defaults, and the flat
    adapter section of earlier versions keeps its method's options only (as loading it does). A config this version
    no longer accepts is compared as written."""
    try:
        return absolute_paths(load_config(saved)).model_dump(mode="json")
    except ConfigError:
        return yaml.safe_load(saved.read_text())


def _config_differences(old: Any, new: Any, path: tuple = ()) -> list[str]:
    if path in _RESUME_FREE_KEYS:
        return []
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for k in sorted(set(old) | set(new)) for d in _config_differences(old.get(k), new.get(k), (*path, k))]
    return [] if old == new else [".".join(map(str, path))]
