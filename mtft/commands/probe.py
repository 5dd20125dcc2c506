"""``run.py probe``: the Gaussian sensitivity probe of one or more checkpoints (Springer et al., 2025).

A checkpoint is a Hugging Face folder with a masked-LM head (what ``run.stage: pretrain`` writes, or any Hub-style
model folder), or a fine-tuning checkpoint of mtft (``<run>/checkpoints/step-N`` or ``<run>/best``), whose run
config names the backbone that lends the MLM head; a checkpoint with routed adapters (Multi-LoRA, LoRA) is probed
once per adapter -- per task, or per objective with ``model.adapter.granularity: objective``.
Several checkpoints (e.g. the token budgets of a pre-training run) give one curve each in the same figure.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from mtft.api.run import output_policy
from mtft.commands import add_trust_plugins
from mtft.core.errors import CheckpointError, UserError
from mtft.models.folders import folder_tokenizer, refuse_remote_code


class ProbeInputError(UserError):
    """A bad argument of ``run.py probe``."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="run.py probe", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--checkpoint", action="append", required=True, type=Path, help="a checkpoint folder (repeat for several)"
    )
    parser.add_argument("--gamma", required=True, help="comma-separated γ values, e.g. 0.01,0.03,0.1")
    parser.add_argument("--seeds", type=int, default=3, help="noise seeds per γ (at least 3; default 3)")
    parser.add_argument("--corpus", default=None, help="corpus (Hub id or folder, Hub layout); default: the built-in")
    parser.add_argument(
        "--languages",
        default=None,
        help="comma-separated languages; default: those the checkpoint was pre-trained or run on",
    )
    parser.add_argument(
        "--split", default=None, help="held-out split (default: the run's corpus.eval_split, or validation)"
    )
    parser.add_argument("--name", default=None, help="dataset config per language (default {language})")
    parser.add_argument("--text-column", default=None, help="text column (default text)")
    parser.add_argument("--max-examples", type=int, default=None, help="held-out texts per language (default 200)")
    parser.add_argument("--max-length", type=int, default=None, help="tokens per text (default: the model's limit)")
    parser.add_argument("--mask-seed", type=int, default=None, help="seed of the fixed masks (default 0)")
    parser.add_argument("--batch-size", type=int, default=64, help="texts per forward pass (default 64)")
    parser.add_argument("--out", type=Path, default=Path("probe"), help="output folder (default ./probe)")
    add_trust_plugins(parser)
    return parser


def parse_gammas(text: str) -> list[float]:
    try:
        gammas = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ProbeInputError(f"--gamma {text!r}: expected comma-separated numbers, e.g. 0.01,0.03,0.1") from None
    if not gammas or not all(math.isfinite(g) and g > 0 for g in gammas):
        raise ProbeInputError(f"--gamma {text!r}: every γ must be a number > 0, and finite")
    return gammas


#: the least value of each integer option (data.max_length's and corpus.mask_seed's bounds for the last two)
MINIMUM = {"batch_size": 1, "max_examples": 1, "max_length": 8, "mask_seed": 0}


def check_args(args: argparse.Namespace) -> list[float]:
    """Every argument that needs no file read, checked before any model is loaded: the γ values (returned), the
    integer options' bounds, and ``--out``, which must be a folder or not exist, under folders only."""
    gammas = parse_gammas(args.gamma)
    if args.seeds < 3:
        raise ProbeInputError(f"--seeds {args.seeds}: at least 3 noise seeds per γ are needed for a spread")
    for key, least in MINIMUM.items():
        value = getattr(args, key)
        if value is not None and value < least:
            raise ProbeInputError(f"--{key.replace('_', '-')} {value}: must be at least {least}")
    for path in (args.out, *args.out.parents):
        if path.exists() and not path.is_symlink():
            if not path.is_dir():
                raise ProbeInputError(f"--out {args.out}: {path} is a file, not a folder")
            break
    policy = output_policy(*args.checkpoint)
    policy.check_place(args.out)  # no link at --out, not a checkpoint probed, not inside a run
    if args.out.is_dir():
        for name in ("probe.json", "sensitivity.png"):
            policy.check_file(args.out / name, overwrite=True)
    return gammas


def main(args: argparse.Namespace) -> int:
    gammas = check_args(args)
    for folder in args.checkpoint:
        if not folder.is_dir():
            raise CheckpointError(f"--checkpoint {folder}: not a folder")
    loaded = [_load(folder, args) for folder in args.checkpoint]  # every input checked before any work
    from mtft.forgetting.plots import plot_sensitivity
    from mtft.forgetting.probe import gaussian_probe, init_stds, probe_json, probe_lp

    results = []
    for label, models, eval_set, fresh in loaded:
        for name, mlm in models:
            stds = init_stds(mlm, fresh)
            evaluate = probe_lp(mlm, eval_set, args.batch_size, torch.device("cpu"))
            result = gaussian_probe(mlm, stds, evaluate, gammas, args.seeds, f"{label}{name}")
            results.append(result)
            print(
                f"{result.model}: {result.perturbed:,} weights perturbed, {result.untouched:,} left alone "
                "(σ_init = 0: norm weights, biases, LoRA A and B)"
            )
            for row in result.summary():
                print(
                    f"{result.model}  γ={row['gamma']:g}  ΔL_p = {row['dlp/mean/mean']:.4f} ± "
                    f"{row['dlp/mean/std']:.4f}  ("
                    + ", ".join(f"{lang} {row[f'dlp/{lang}/mean']:.4f}" for lang in result.baseline)
                    + ")"
                )
    policy = output_policy(*args.checkpoint)
    args.out.mkdir(parents=True, exist_ok=True)
    with policy.writing_file(args.out / "probe.json", overwrite=True) as handle:
        handle.write(probe_json(results))
    languages = list(results[0].baseline)
    with policy.writing_file(args.out / "sensitivity.png", overwrite=True, binary=True) as handle:
        plot_sensitivity([row for r in results for row in r.summary()], languages, handle)  # rows: one per γ
    print(f"wrote {args.out / 'probe.json'} and {args.out / 'sensitivity.png'}")
    return 0


def _load(folder: Path, args):
    """(label, [(adapter name, MaskedLM)], evaluation set, fresh model for the init stds) of one checkpoint."""
    from mtft.config.run_config import RunConfig
    from mtft.forgetting.corpus import build_eval_set
    from mtft.forgetting.mlm import MaskedLM, load_mlm_checkpoint, load_mlm_model, split_mlm_model

    if (folder / "config.json").is_file():
        refuse_remote_code(folder, "model folder")
        mlm_model, head_missing = load_mlm_checkpoint(str(folder), None, False)
        if head_missing:
            raise CheckpointError(
                f"--checkpoint {folder}: no masked-LM head in the checkpoint ({', '.join(head_missing[:3])} missing), "
                "so it has no L_p to probe; probe a fine-tuning checkpoint of a run on it (its monitors fit a head)"
            )
        mlm_model.eval()
        tokenizer = folder_tokenizer(folder, "model folder")
        meta = folder / "pretrain.json"
        trained_on = json.loads(meta.read_text()).get("languages") if meta.is_file() else None
        encoder, head, tied = split_mlm_model(mlm_model)
        models = [("", MaskedLM(encoder, head, tied))]
        config = RunConfig.model_validate(
            {"run": {"stage": "pretrain"}, "data": {}, "corpus": _corpus(args, {"languages": trained_on}, folder)}
        )
        max_length = args.max_length or mlm_model.config.max_position_embeddings - 2
    else:
        config, models, mlm_model, tokenizer = _finetune_checkpoint(folder, args)
        max_length = args.max_length or config.data.max_length
    eval_set = build_eval_set(config.corpus, config.data, tokenizer, config.corpus.languages, max_length)
    fresh = load_mlm_model("tiny", None, False, mlm_model.config)
    return f"{folder.name}", models, eval_set, fresh


def _corpus(args, defaults: dict, folder) -> dict:
    """The corpus section: ``defaults`` (the run's, or what a pre-trained folder says) overridden by the flags."""
    given = {
        "path": args.corpus,
        "name": args.name,
        "text_column": args.text_column,
        "eval_split": args.split,
        "max_eval_examples": args.max_examples,
        "mask_seed": args.mask_seed,
        "languages": args.languages.split(",") if args.languages else None,
    }
    corpus = {**defaults, **{k: v for k, v in given.items() if v is not None}}
    if not corpus.get("languages"):
        raise ProbeInputError(f"--languages: {folder} does not say which languages it knows; list them")
    return corpus


def _surt_backbone(folder: Path, config, run, backbone: str, revision) -> str:
    """The cache entry of the backbone SURT re-trained for the run (mtft.training.surt), which must exist."""
    from mtft.config.paths import cache_dir
    from mtft.core.atomic import MARKER
    from mtft.data.pipeline import task_training_texts
    from mtft.training.checkpoint import latest_checkpoint, saved_world_size
    from mtft.training.surt import surt_key

    model = config.model.model_copy(update={"backbone": backbone, "revision": revision})
    world_size = saved_world_size(latest_checkpoint(run.run_dir) or run.checkpoint)
    key = surt_key(
        config.model_copy(update={"model": model}),
        task_training_texts(config.data, config.evaluation.split),
        world_size,
    )
    entry = cache_dir(config.data) / "surt" / key
    if not (entry / MARKER).is_file():
        raise CheckpointError(
            f"--checkpoint {folder}: its SURT re-trained backbone is not in the cache ({entry}); "
            "run the run's config again to rebuild it"
        )
    return str(entry)


def _finetune_checkpoint(folder: Path, args):
    """A fine-tuning checkpoint, rebuilt as every restore is (:func:`mtft.training.restore.load_run`), under the
    MLM head of the backbone it was fine-tuned from: one model per adapter the method routes to."""
    from mtft.config.paths import cache_dir
    from mtft.core.atomic import MARKER
    from mtft.forgetting.head_fit import fitted_head
    from mtft.forgetting.mlm import attach_head, load_mlm_checkpoint
    from mtft.training.checkpoint import latest_checkpoint, saved_world_size
    from mtft.training.pretrain import prelude_key, task_languages, tiny_task_texts
    from mtft.training.restore import find_run_dir, load_run

    try:
        is_checkpoint = find_run_dir(folder)[1] is not None and (folder / "heads.json").is_file()
    except CheckpointError:  # no run directory at or above it
        is_checkpoint = False
    if not is_checkpoint:
        raise CheckpointError(
            f"--checkpoint {folder}: neither a Hugging Face folder (config.json) nor an mtft "
            "checkpoint (model.safetensors, heads.json, and the run's config.yaml above it)"
        )
    run = load_run(folder, trust_plugins=args.trust_plugins)
    config = run.config
    backbone, revision = config.model.backbone, config.model.revision
    languages = config.corpus.languages or task_languages(config)
    if config.pretrain.before_finetune:
        backbone, revision = (
            str(
                cache_dir(config.data)
                / "pretrained"
                / prelude_key(
                    config,
                    languages,
                    tiny_task_texts(config),
                    saved_world_size(latest_checkpoint(run.run_dir) or run.checkpoint),
                )
            ),
            None,
        )
        if not (Path(backbone) / MARKER).is_file():
            raise CheckpointError(
                f"--checkpoint {folder}: its pre-trained backbone is not in the cache ({backbone}); "
                "run the run's config again to rebuild it"
            )
    elif backbone == "tiny":
        raise CheckpointError(
            f"--checkpoint {folder}: the run fine-tuned an untrained tiny encoder, which has no "
            "masked-LM head to probe; pre-train it (pretrain.before_finetune) or probe a backbone"
        )
    if config.stability.surt.enabled:  # fine-tuned from the SURT re-trained backbone: probe under its head
        backbone, revision = _surt_backbone(folder, config, run, backbone, revision), None
    mlm_model, head_missing = load_mlm_checkpoint(backbone, revision, config.model.trust_remote_code)
    if head_missing:  # the head the run's monitors fitted to θ_p (from the cache, or fitted again alike)
        fitted_head(
            mlm_model, run.tokenizer, config.forgetting.head_fit, config.corpus, config.data, languages, backbone
        )
    models = []
    for slot, name in enumerate(run.method.probe_slots(list(run.heads), run.objectives)):
        mlm = attach_head(run.model.encoder, mlm_model)
        mlm.adapter = slot  # every row through this slot's adapter
        models.append((f"/{name}" if name else "", mlm))
    corpus = _corpus(args, {**config.corpus.model_dump(), "languages": languages}, folder)
    config = config.model_copy(update={"corpus": type(config.corpus).model_validate(corpus)})
    return config, models, mlm_model, run.tokenizer
