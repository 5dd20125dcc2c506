"""``python run.py export --run <run dir> --out <dir> [--merge]``: what a run learnt, for ``transformers`` / ``peft``.

A run without adapters (full fine-tuning, heads only) is written as ``encoder/`` -- ``save_pretrained`` of the
fine-tuned encoder in its backbone's own class, with the tokenizer, so ``AutoModel.from_pretrained`` loads it --
and ``<task>/head.safetensors`` + ``head.json`` per task. With ``--merge``, a LoRA / Multi-LoRA run is written so
too, one plain encoder per task (or objective) with its adapter merged into the weights, in ``<task>/``.

Otherwise a run's adapters are exported as standard PEFT LoRA directories, one per task (or per objective).
Each directory is written by PEFT itself (``save_pretrained`` of a one-adapter ``PeftModel`` on the run's base
encoder), so any PEFT user loads it with ``PeftModel.from_pretrained(base, dir)``: for Multi-LoRA, A is copied
into ``lora_A`` and the task's B into ``lora_B``. Beside it, ``head.safetensors`` + ``head.json`` hold the task
head and its label names. A run on the built-in ``tiny`` backbone has no Hub id, so its base encoder and
tokenizer are written to ``base/``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import warnings
from pathlib import Path
from typing import Any, Iterator, Union

import peft
import torch
from peft.tuners.lora import LoraLayer
from safetensors.torch import save_file

from mtft.adapters import METHODS, AdapterMethod
from mtft.api.run import output_policy
from mtft.commands import add_trust_plugins
from mtft.commands.export_transformers import AUTO, check_logits, exportable, save_transformers, transformers_model
from mtft.commands.model_card import model_card, write_card
from mtft.core.atomic import write_json
from mtft.core.distributed import quiet_cpu_accelerator
from mtft.core.errors import CheckpointError
from mtft.core.output import OutputPolicy
from mtft.core.paths import inside
from mtft.models.named_backbones import NAMED
from mtft.runs import plain_encoder
from mtft.training.restore import CHECKPOINT_HELP, LoadedRun, load_run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="run.py export",
        description="Write each task's adapter of a multi_lora or lora run as a PEFT LoRA directory (load it with "
        "peft.PeftModel.from_pretrained on the base encoder), or with --merge as a Transformers folder with the "
        "adapter merged in; a full (or head) fine-tuning run's encoder as a Transformers folder (AutoModel."
        "from_pretrained). Each task's head and its label names go beside it.",
    )
    parser.add_argument("--run", required=True, type=Path, help="the run directory (run.output_dir)")
    parser.add_argument("--out", required=True, type=Path, help="a new (or empty) directory to write into")
    parser.add_argument("--checkpoint", default=None, help=CHECKPOINT_HELP)
    parser.add_argument(
        "--merge",
        action="store_true",
        help="LoRA / Multi-LoRA: write each task's encoder with its adapter merged into the weights (a plain "
        "Transformers folder per task) instead of PEFT adapters",
    )
    parser.add_argument(
        "--transformers",
        action="store_true",
        help="write each task as the Transformers model of its kind (AutoModelForSequenceClassification, "
        "...TokenClassification, ...QuestionAnswering; id2label from the run; a LoRA or Multi-LoRA adapter merged "
        "into the weights), checked to give the run's logits",
    )
    add_trust_plugins(parser)
    return parser


def main(args: argparse.Namespace) -> int:
    for folder in export_run(args.run, args.out, args.checkpoint, args.merge, args.trust_plugins, args.transformers):
        print(folder)
    return 0


def export_run(
    run_dir: Path,
    out: Path,
    checkpoint: Union[str, Path, None] = None,
    merge: bool = False,
    trust_plugins: bool = False,
    transformers: bool = False,
) -> list[Path]:
    """Write every adapter (with ``merge``: every task's encoder with its adapter merged in; without adapters: the
    encoder) of ``run_dir`` at ``checkpoint`` (best/ by default, as every command) under ``out`` (which must not
    exist or be empty); return the folders written. With ``transformers``: each task as its kind's Transformers
    model (:mod:`mtft.commands.export_transformers`). Every folder carries a model card
    (:mod:`mtft.commands.model_card`). Written under the output policy (:mod:`mtft.core.output`): whole or not at
    all, never inside the run, a second writer refused."""
    out = Path(out)
    policy = output_policy(run_dir)
    policy.check_folder(out)
    quiet_cpu_accelerator()  # PEFT's save asks transformers about DeepSpeed, which would warn about the CPU
    run = load_run(run_dir, checkpoint, trust_plugins)
    method = run.config.model.adapter.method
    if merge and transformers:
        raise CheckpointError("--transformers merges a LoRA adapter into its task's model already; drop --merge")
    if transformers:
        return _export_transformers(run, out, method, policy)
    if run.method.routing is None and not run.method.exports_lora:  # full fine-tuning, heads only: no adapters
        if merge:
            raise CheckpointError(f"{run_dir} fine-tuned with model.adapter.method={method}: no adapter to --merge")
        return _export_encoder(run, out, method, policy)
    if not run.method.exports_lora:
        exportable = " or ".join(sorted(name for name, cls in METHODS.items() if cls.exports_lora))
        raise CheckpointError(
            f"{run_dir} fine-tuned with model.adapter.method={method}; export writes LoRA adapters ({exportable} runs)"
        )
    slots = _slots(run)
    with policy.writing_folder(out, kind="export", method=method) as partial, _quiet_libraries():
        base_ref = _write_base(run, partial) if not merge else run.config.model.backbone
        for slot, (name, task) in enumerate(slots):
            folder = inside(partial, *name.split("/"))  # an objective's slot is <task>/<language>
            model = peft_model_for(run.model.encoder, run.method, slot, name, base_ref)
            if merge:  # W0 + BA in the weights: a plain encoder of the backbone's own class
                _save_encoder(model.merge_and_unload(), run, folder)
                write_card(folder, model_card(run, task, run.config.model.backbone, "transformers", _load_encoder()))
            else:
                # the embeddings are frozen under LoRA: nothing of them to save (and no vocabulary check, which
                # looks for a config.json at base_ref and warns when the base is the export's own ../base)
                model.save_pretrained(str(folder), save_embedding_layers=False)
                write_card(folder, model_card(run, task, base_ref, "peft", _load_adapter(base_ref)))  # PEFT's template
            _write_head(run, task, folder)
        _write_record(partial, run, method, "merged" if merge else "peft", base_model=base_ref, adapters=dict(slots))
    return [inside(out, *name.split("/")) for name, _ in slots]


def _export_transformers(run: LoadedRun, out: Path, method: str, policy: OutputPolicy) -> list[Path]:
    """Every task (every routing slot of an adapter method) as its kind's Transformers model, adapters merged."""
    adapted = run.method.routing is not None or run.method.exports_lora
    slots = _slots(run) if adapted else [(task, task) for task in run.heads]
    for _, task in slots:
        transformers_model_check(run, task)
    with policy.writing_folder(out, kind="export", method=method) as partial, _quiet_libraries():
        for slot, (name, task) in enumerate(slots):
            folder = inside(partial, *name.split("/"))
            encoder = run.model.encoder
            if adapted:  # the slot's adapter merged into W0: the encoder that task's rows see
                encoder = peft_model_for(encoder, run.method, slot, name, run.config.model.backbone).merge_and_unload()
            kind, labels = run.heads[task]["kind"], run.heads[task]["label_names"]
            model = transformers_model(encoder, run.model.heads[task], kind, labels, task)
            objective = run.objectives.index(name) if adapted and run.method.routing == "objective" else None
            check_logits(model, run, task, kind, objective)
            save_transformers(model, run, folder)
            write_card(folder, model_card(run, task, run.config.model.backbone, "transformers", _load_auto(kind)))
        _write_record(partial, run, method, "transformers", tasks=dict(slots))
    return [inside(out, *name.split("/")) for name, _ in slots]


def transformers_model_check(run: LoadedRun, task: str) -> None:
    """Refuse, before anything is written, a task whose kind no AutoModelFor class holds."""
    kind = run.heads[task]["kind"]
    if not exportable(kind):
        transformers_model(run.model.encoder, run.model.heads[task], kind, [], task)  # raises its one line


def _write_record(folder: Path, run: LoadedRun, method: str, form: str, **what: Any) -> None:
    """``export.json``: the run and checkpoint exported, the method and format, what the folder holds (``what``) and
    the longest row the run was trained on."""
    record = {"run": str(run.run_dir.resolve()), "checkpoint": str(run.checkpoint.resolve()), "method": method}
    write_json(folder / "export.json", {**record, "format": form, **what, "max_length": _max_lengths(run)})


def _max_lengths(run: LoadedRun) -> dict[str, int]:
    """The tokens a row of each task was cut to in training: what a user of the export should cut to as well."""
    default = run.config.data.max_length
    lengths = {t.name: t.max_length or default for t in run.config.data.tasks}
    return {task: lengths.get(task, default) for task in run.heads}


def _load_auto(kind: str) -> str:
    auto = AUTO[kind].__name__
    return (
        f"from transformers import {auto}, AutoTokenizer\n\n"
        f'model = {auto}.from_pretrained("<this folder>")\n'
        'tokenizer = AutoTokenizer.from_pretrained("<this folder>")\n'
        'logits = model(**tokenizer(texts, return_tensors="pt", padding=True)).logits  # id2label: model.config'
    )


def _load_adapter(base_ref: str) -> str:
    return (
        "import peft\nfrom transformers import AutoModel\n\n"
        f'encoder = peft.PeftModel.from_pretrained(AutoModel.from_pretrained("{base_ref}"), "<this folder>")\n'
        "# the task's head: head.safetensors (weights) and head.json (kind, label names) beside the adapter"
    )


def _load_encoder() -> str:
    return (
        "from transformers import AutoModel, AutoTokenizer\n\n"
        'encoder = AutoModel.from_pretrained("<this folder>")\n'
        "# the task's head: head.safetensors (weights) and head.json (kind, label names) beside it"
    )


def _export_encoder(run: LoadedRun, out: Path, method: str, policy: OutputPolicy) -> list[Path]:
    """A run without adapters: ``encoder/`` (the fine-tuned encoder as its backbone's own Transformers class,
    with the tokenizer) and one folder per task holding its head."""
    with policy.writing_folder(out, kind="export", method=method) as partial, _quiet_libraries():
        _save_encoder(run.model.encoder, run, partial / "encoder")
        first = next(iter(run.heads))
        write_card(
            partial / "encoder", model_card(run, first, run.config.model.backbone, "transformers", _load_encoder())
        )
        for task in run.heads:
            _write_head(run, task, inside(partial, task))
            write_card(
                inside(partial, task), model_card(run, task, run.config.model.backbone, "transformers", _load_encoder())
            )
        _write_record(partial, run, method, "encoder", encoder="encoder", heads=list(run.heads))
    return [out / "encoder", *(inside(out, task) for task in run.heads)]


def _save_encoder(encoder: torch.nn.Module, run: LoadedRun, folder: Path) -> None:
    """``save_pretrained`` of the encoder (its own class: ``AutoModel.from_pretrained`` loads it) and the
    tokenizer. mtft's encoders have no pooler (the heads pool), so none is saved: transformers initialises one
    when the class has it, which nothing of the run reads (``last_hidden_state`` is the encoder's output)."""
    encoder.save_pretrained(str(folder))
    run.tokenizer.save_pretrained(str(folder))


@contextlib.contextmanager
def _quiet_libraries() -> Iterator[None]:
    """What the user sees of an export is mtft's own summary: transformers' shard-writing progress bar and its
    deprecation notices about its own internals (raised inside PEFT's save) say nothing about the export."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning, module=r"transformers\.")
            yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _slots(run: LoadedRun) -> list[tuple[str, str]]:
    """(adapter directory name, task whose head goes with it) per routing slot, in slot order."""
    names = run.method.slots(list(run.heads), run.objectives)
    if run.method.routing == "task":
        return [(task, task) for task in names]
    if run.config.weighting.objectives == "language":
        raise CheckpointError(
            "adapters kept per objective with weighting.objectives=language span several tasks' "
            "heads; export needs objectives per (task, language) or per task"
        )
    return [(name, name.split("/")[0]) for name in names]


def _write_base(run: LoadedRun, out: Path) -> str:
    """The base the adapters sit on, as the export names it: the backbone's Hub id or folder where that is what the
    run fine-tuned, else written to ``base/`` with the run's tokenizer -- the tiny encoder, a backbone pre-trained or
    re-trained by the run (pretrain.before_finetune, SURT), cut to the run's vocabulary, randomly initialised, or one
    mtft converts itself (multilingual-e5-small: its folder lives in the user's cache)."""
    if named_as_configured(run.config):
        return run.config.model.backbone  # the base is the Hub model or folder, unchanged by adapter training
    base = base_encoder(run.model.encoder)
    base.save_pretrained(str(out / "base"))
    run.tokenizer.save_pretrained(str(out / "base"))
    return "../base"


def named_as_configured(config) -> bool:
    """Whether the encoder a run started from is ``model.backbone`` as a user elsewhere loads it by that name."""
    model = config.model
    return (
        model.backbone != "tiny"
        and model.backbone not in NAMED
        and model.vocabulary == "full"
        and model.weights == "pretrained"
        and not config.pretrain.before_finetune
        and not config.stability.surt.enabled
    )


def base_encoder(encoder: torch.nn.Module) -> torch.nn.Module:
    """A plain copy of a LoRA-adapted ``encoder``, adapters removed: the frozen W0 every adapter sits on."""
    base = plain_encoder(encoder.config)
    state = {}
    for name, value in encoder.state_dict().items():
        if ".lora_" in name:
            continue
        state[name.replace(".base_layer.", ".")] = value
    missing, unexpected = base.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise CheckpointError(f"cannot separate the base encoder: missing {missing[:3]}, unexpected {unexpected[:3]}")
    return base.eval()


def peft_model_for(
    encoder: torch.nn.Module, method: AdapterMethod, slot: int, name: str, base_ref: str
) -> peft.PeftModel:
    """Routing slot ``slot`` (named ``name``) of ``encoder`` as a one-adapter PEFT model on the base encoder,
    its config pointing at ``base_ref``."""
    config = method.peft_config()
    config.target_modules = without_pooler(config.target_modules)
    model = peft.get_peft_model(base_encoder(encoder), config)
    model.peft_config["default"].base_model_name_or_path = base_ref  # PEFT fills in the in-memory model's path
    ours = method.adapter_weights(encoder, slot, name)
    theirs = {n.removeprefix("base_model.model."): m for n, m in model.named_modules() if isinstance(m, LoraLayer)}
    if set(ours) != set(theirs):
        raise CheckpointError(f"PEFT adapts other layers than the run: {sorted(set(ours) ^ set(theirs))[:4]}")
    with torch.no_grad():
        for layer_name, (a, b) in ours.items():
            theirs[layer_name].lora_A["default"].weight.copy_(a)
            theirs[layer_name].lora_B["default"].weight.copy_(b)
    return model


def without_pooler(targets: Union[str, set[str], list[str]]) -> Union[str, set[str], list[str]]:
    """``target_modules`` as a regex that PEFT matches like the names given (a module named so, or ending in
    ``.name``) but never under ``pooler.``. mtft's encoders have no pooler (the heads pool for themselves), so no
    adapter was trained there; loaded back on a checkpoint that ships one (BERT, MiniLM), the names alone would put
    an untrained LoRA on ``pooler.dense`` and PEFT would warn about its missing weights. (PEFT's
    ``exclude_modules`` warns instead wherever there is no pooler to exclude.) A regex of the user's own is kept."""
    if isinstance(targets, str):
        return targets
    names = "|".join(re.escape(name) for name in sorted(targets))
    return rf"(?!pooler\.)(?:.*\.)?(?:{names})"


def _write_head(run: LoadedRun, task: str, folder: Path) -> None:
    head = run.model.heads[task]
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in head.state_dict().items()}, str(folder / "head.safetensors"))
    meta = {"task": task, **run.heads[task], "hidden_size": run.model.encoder.config.hidden_size}
    (folder / "head.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
