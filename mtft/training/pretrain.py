"""Masked-LM pre-training: ``run.stage: pretrain``, and the cached prelude of ``pretrain.before_finetune``.

The backbone is pre-trained on ``corpus`` (its ``train_split``, in ``corpus.languages``) from scratch (``tiny``:
a random XLM-R of the ``model.tiny`` shape, with a tokenizer trained on the corpus) or continued (a Hub id or
folder with a masked-LM head). Texts are packed into blocks of ``block_size`` tokens as transformers'
``run_mlm.py`` does and masked dynamically by ``DataCollatorForLanguageModeling``, so a step sees exactly
global batch × block_size tokens and token budgets are exact multiples of it (a checkpoint is saved at the
first step that reaches its budget). The loop is the same DeepSpeed engine as fine-tuning.

Every checkpoint is a Hugging Face folder (``config.json``, ``model.safetensors``, the tokenizer,
``pretrain.json`` with tokens, steps and L_p per language), written as ``.partial`` and renamed when complete,
so ``model.backbone: <folder>`` fine-tunes from it and ``run.py probe --checkpoint <folder>`` probes it.

``schedule_per_budget`` pre-trains every budget from scratch with its own schedule annealed to zero (the
controlled set-up of Springer et al., 2025, "Overtrained language models are harder to fine-tune", where budgets
must not be confounded by the learning-rate schedule).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch
from tqdm import tqdm
from transformers import AutoModelForMaskedLM

from mtft.config.paths import cache_dir
from mtft.config.run_config import RunConfig
from mtft.config.schema import CorpusSection, DataSection, ModelSection, OptimizerSection
from mtft.core.atomic import AtomicFolder, write_json
from mtft.core.distributed import ProcessInfo, barrier, init_distributed
from mtft.core.errors import ConfigError
from mtft.core.labels import IGNORE_INDEX
from mtft.data.pipeline import task_texts
from mtft.data.selection import select_tasks
from mtft.data.sources import resolve_source
from mtft.forgetting.corpus import build_eval_set, corpus_path, corpus_texts, masking_collator, packed_blocks
from mtft.forgetting.mlm import MaskedLM, load_mlm_checkpoint, load_mlm_model, lp_per_language, split_mlm_model
from mtft.models.backbone import tiny_config
from mtft.models.tokenizer import load_backbone_tokenizer, tiny_tokenizer
from mtft.reporting.logs import MetricsLog, add_file_log, held_log_lines, logger, setup_console_logging
from mtft.tasks.base import DatasetRef
from mtft.training import checkpoint as ckpt
from mtft.training.engine import deepspeed_patches_undone, initialize, masked_lm_engine
from mtft.training.rundir import create_run_dir
from mtft.training.stage_cache import content_digest, from_cache_or_fill, stage_key

# bump when pre-training changes what it produces, to invalidate cached checkpoints (4: the fixture world of
# translations and the BPE tiny tokenizer; 6: the loss from logits at the masked positions only, equal to the
# model's own loss up to round-off)
PRETRAIN_VERSION = "6"


class MaskedPositionsLM(torch.nn.Module):
    """A ``…ForMaskedLM`` model (``mlm``) whose loss is computed from logits at the masked positions only.

    The model's own loss forms vocabulary-sized logits at every position and then ignores the ~85% that carry no
    target; the head is position-wise, so running it on the masked positions alone gives the same loss and
    gradient (the mean cross-entropy over the masked tokens, as the forgetting monitors' L_p computes it,
    :class:`mtft.forgetting.mlm.MaskedLM`) without them. The engine trains this module; the checkpoint is
    ``mlm``'s, under its own parameter names."""

    PREFIX = "mlm."

    def __init__(self, mlm: torch.nn.Module):
        super().__init__()
        self.mlm = mlm
        self._parts = split_mlm_model(mlm)[:2]  # (encoder, head): mlm's own modules, a tuple registers nothing

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        encoder, head = self._parts
        hidden = encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        targets = labels != IGNORE_INDEX
        logits = head(hidden[targets])
        if logits.element_size() < 4:  # half precision: the softmax in float32
            logits = logits.float()
        return torch.nn.functional.cross_entropy(logits, labels[targets])


class Pretraining:
    """Corpus, tokenizer, blocks and model factory of one pre-training set-up (``config.pretrain``)."""

    def __init__(
        self,
        config: RunConfig,
        languages: list[str],
        proc: ProcessInfo,
        task_texts: Sequence[str] = (),
        training_texts: Optional[Sequence[str]] = None,
        optimizer: Optional[OptimizerSection] = None,
    ):
        """``task_texts``: the fine-tuning tasks' texts, which a tiny tokenizer's vocabulary covers too (a real
        encoder's vocabulary covers the task's text; one trained on the generic corpus alone splits a NER task's
        names into characters). ``training_texts``: train on these instead of the corpus (SURT, mtft/training/
        surt.py): no corpus is read, L_p is not evaluated, and the backbone must bring its own masked-LM head.
        ``optimizer``: in place of ``pretrain.optimizer`` (SURT's learning rate)."""
        self.config, self.languages, self.proc = config, languages, proc
        self.optimizer = optimizer or config.pretrain.optimizer
        self.retraining = training_texts is not None
        p = config.pretrain
        self.block_size = p.block_size or config.data.max_length
        if training_texts is not None:
            texts = {"tasks": list(training_texts)}
        else:
            texts = {
                lang: corpus_texts(config.corpus, config.data, lang, config.corpus.train_split) for lang in languages
            }
        model = config.model
        if model.backbone == "tiny":
            self.tokenizer = tiny_tokenizer(
                [t for ts in texts.values() for t in ts] + list(task_texts),
                model.tiny.vocab_size,
                cache_dir(config.data),
            )
            self.mlm_config = tiny_config(model, self.tokenizer, max(self.block_size, config.data.longest_row))
        else:
            self.tokenizer = load_backbone_tokenizer(model.backbone, model.revision, model.trust_remote_code)
            self.mlm_config = None
        masking_collator(self.tokenizer, config.corpus.mlm_probability)  # no mask token: one clear error now
        self.blocks = [b for ts in texts.values() for b in packed_blocks(self.tokenizer, ts, self.block_size)]
        self.tokens_per_step = p.micro_batch_size * proc.world_size * self.block_size
        if len(self.blocks) < p.micro_batch_size * proc.world_size:
            source = "the tasks' training text (stability.surt)" if self.retraining else "corpus"
            raise ConfigError(
                f"{source}: {len(self.blocks)} blocks of {self.block_size} tokens are fewer than one "
                f"global batch ({p.micro_batch_size * proc.world_size}); lower pretrain.micro_batch_size"
            )
        self.eval_set = (
            None
            if self.retraining
            else build_eval_set(config.corpus, config.data, self.tokenizer, languages, self.block_size)
        )

    def new_model(self):
        model = self.config.model
        if self.mlm_config is not None:
            torch.manual_seed(self.config.pretrain.seed)
            return AutoModelForMaskedLM.from_config(self.mlm_config)
        if not self.retraining:
            return load_mlm_model(model.backbone, model.revision, model.trust_remote_code)
        mlm, head_missing = load_mlm_checkpoint(model.backbone, model.revision, model.trust_remote_code)
        if head_missing:
            # a random head would send noise into the encoder for SURT's first steps -- the opposite of starting
            # fine-tuning closer to its end point (Fu, So & Collier, 2023, Theorem 2.2)
            raise ConfigError(
                f"stability.surt: model.backbone={model.backbone!r} has no masked-LM head to re-train with "
                f"(lacks {', '.join(head_missing[:3])}{', ...' if len(head_missing) > 3 else ''}); use a backbone "
                "with one, or pretrain.before_finetune to pre-train one first"
            )
        return mlm

    def steps_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.tokens_per_step)

    def train(
        self,
        tokens: int,
        budgets: list[int],
        save: Callable[[int, int, int, dict, object], None],
        log: Optional[MetricsLog],
        step_offset: int = 0,
    ) -> None:
        """One run of ``tokens`` tokens with its own schedule; ``save(budget, tokens_seen, step, lp, engine)`` at
        each budget it passes."""
        p, proc = self.config.pretrain, self.proc
        steps = self.steps_for(tokens)
        self.schedule_steps = steps  # the schedule this run anneals over, recorded with each checkpoint
        model = MaskedPositionsLM(self.new_model())
        engine = initialize(model, masked_lm_engine(self.config, self.optimizer, steps, proc.world_size))
        engine.train()
        torch.manual_seed(self.config.pretrain.seed + 1 + proc.rank)  # masking and dropout stream of this rank
        collator = masking_collator(self.tokenizer, self.config.corpus.mlm_probability)
        order = torch.Generator().manual_seed(self.config.pretrain.seed)
        batch_rows = p.micro_batch_size * proc.world_size
        queue: list[int] = []
        pending = sorted(b for b in budgets if b <= tokens)
        seen, window, start = 0, [], time.perf_counter()
        show = proc.is_main and self.config.logging.progress_bar
        bar = tqdm(total=steps, desc="pre-training", dynamic_ncols=True, disable=not show, unit="step")
        for step in range(1, steps + 1):
            while len(queue) < batch_rows:  # a fresh permutation of the blocks per pass
                queue += torch.randperm(len(self.blocks), generator=order).tolist()
            rows, queue = queue[:batch_rows], queue[batch_rows:]
            mine = rows[proc.rank * p.micro_batch_size : (proc.rank + 1) * p.micro_batch_size]
            batch = collator([{"input_ids": self.blocks[i], "attention_mask": [1] * self.block_size} for i in mine])
            loss = engine(**{k: v.to(engine.device) for k, v in batch.items()})
            engine.backward(loss)
            lr = engine.get_lr()[0]  # the rate this step uses: engine.step() moves the schedule on
            engine.step()
            seen += self.tokens_per_step
            window.append(float(loss.detach()))
            bar.update(1)
            if step % p.log_every_steps == 0 or step == steps:  # pretrain.log_every_steps: a line, and the bar's loss
                mean, seconds = sum(window) / len(window), time.perf_counter() - start
                bar.set_postfix(loss=f"{mean:.3f}", refresh=False)
                logger.info(f"pre-training step {step}/{steps}: loss {mean:.4f}, {seen:,} tokens, {seconds:.0f} s")
                if log is not None:
                    log.log(
                        step_offset + step, "pretrain", {"loss": mean, "tokens": seen, "lr": lr, "seconds": seconds}
                    )
                window = []
            while pending and seen >= pending[0]:
                budget = pending.pop(0)
                save(budget, seen, step, self.evaluate(engine.module.mlm), engine)
        bar.close()

    def evaluate(self, mlm_model) -> dict[str, float]:
        if self.eval_set is None:
            return {}
        encoder, head, tied = split_mlm_model(mlm_model)
        wrapper = MaskedLM(encoder, head, tied)
        return lp_per_language(wrapper, self.eval_set, 64, next(mlm_model.parameters()).device, shard=True)

    def write_checkpoint(self, folder: Path, engine, meta: dict) -> None:
        """A Hugging Face folder, complete or invisible (``.partial`` renamed at the end)."""
        prefix = MaskedPositionsLM.PREFIX
        state = {name.removeprefix(prefix): value for name, value in ckpt.full_state_dict(engine).items()}
        if self.proc.is_main:
            with AtomicFolder(folder).writing(kind="pretrained", tokens=meta["tokens_budget"]) as partial:
                engine.module.mlm.save_pretrained(str(partial), state_dict=state)
                self.tokenizer.save_pretrained(str(partial))
                write_json(partial / "pretrain.json", meta)
        barrier()


def _meta(
    config: RunConfig, languages: list[str], budget: int, seen: int, step: int, lp: dict, engine, schedule_steps: int
) -> dict:
    """``pretrain.json``. ``lr_after``: the scheduler's learning rate after the checkpoint's step, 0 when the
    checkpoint ends its own schedule annealed to zero; an intermediate checkpoint of a longer schedule (the cheaper
    alternative to ``schedule_per_budget``) has ``steps`` < ``schedule_steps`` and a positive ``lr_after``."""
    return {
        "tokens_budget": budget,
        "tokens_seen": seen,
        "steps": step,
        "schedule_steps": schedule_steps,
        "scheduler": config.pretrain.scheduler.name,
        "lr_after": float(engine.get_lr()[0]),
        "lp": lp,
        "languages": languages,
        "corpus": corpus_path(config.corpus),
        "backbone": config.model.backbone,
        "seed": config.pretrain.seed,
    }


def quiet_progress() -> None:
    """mtft logs one line per stage; the libraries' own progress bars would only interleave with it."""
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()


# ------------------------------------------------------------------------------------------------------
def task_languages(config: RunConfig) -> list[str]:
    return list(
        dict.fromkeys(
            lang for chosen in select_tasks(config.data, config.evaluation.split) for lang in chosen.languages
        )
    )


def prelude_key(config: RunConfig, languages: list[str], texts: Sequence[str] = (), world_size: int = 1) -> str:
    """A hash of everything that determines the pre-trained checkpoint of ``pretrain.before_finetune``
    (``texts``: the task texts a tiny tokenizer is trained on besides the corpus), with the process count and ZeRO
    stage of the launch (:func:`mtft.training.stage_cache.stage_key`); ``run.seed`` is not part of it, so the
    seeds of a study share one pre-trained backbone (it follows ``pretrain.seed``)."""
    # the keys that cannot differ for the tiny encoder it pre-trains (vocabulary, weights) are left out: the keys of
    # checkpoints cached before they existed stay valid
    model = config.model.model_dump(mode="json", exclude={"adapter", "classifier_dropout", "vocabulary", "weights"})
    parts = {
        "version": PRETRAIN_VERSION,
        "model": model,
        "max_length": config.data.longest_row,
        "pretrain": config.pretrain.model_dump(mode="json", exclude={"before_finetune"}),
        "corpus": config.corpus.model_dump(mode="json", exclude={"languages"}),
        "languages": languages,
        "corpus_files": _corpus_digest(config.corpus, config.data),
        "task_texts": hashlib.sha256("\0".join(texts).encode()).hexdigest() if texts else None,
    }
    return stage_key(config, world_size, parts)


def _corpus_digest(corpus: CorpusSection, data: DataSection) -> str:
    """Content hash of a local corpus (a Hub corpus is named by its id; ``data.sources`` may point it elsewhere)."""
    ref = resolve_source(DatasetRef(path=corpus_path(corpus), split="train"), data.sources)
    root = Path(ref.data_files or ref.path)
    if not root.exists():
        return ref.path
    return content_digest(root, root.parent)


def pretrained_backbone(config: RunConfig, proc: ProcessInfo) -> ModelSection:
    """``config.model``, or -- with ``pretrain.before_finetune`` -- a copy whose ``backbone`` is the pre-trained
    checkpoint, taken from the cache or pre-trained now (every rank trains, rank 0 writes)."""
    if not config.pretrain.before_finetune:
        return config.model
    quiet_progress()
    languages = config.corpus.languages or task_languages(config)
    texts = tiny_task_texts(config)
    folder = cache_dir(config.data) / "pretrained" / prelude_key(config, languages, texts, proc.world_size)
    from_cache_or_fill(
        folder, proc, "pre-trained backbone", lambda: _pretrain_into(config, languages, folder, proc, texts)
    )
    return config.model.model_copy(update={"backbone": str(folder), "revision": None})


def tiny_task_texts(config: RunConfig) -> list[str]:
    """The tasks' texts for a tiny backbone's tokenizer (``pretrain.vocabulary: corpus+tasks``), else nothing."""
    return (
        task_texts(config.data, config.evaluation.split)
        if config.model.backbone == "tiny" and config.pretrain.vocabulary == "corpus+tasks"
        else []
    )


def _pretrain_into(config: RunConfig, languages: list[str], folder: Path, proc: ProcessInfo, texts: list[str]) -> None:
    """Pre-train the backbone of ``pretrain.before_finetune`` into the cache entry ``folder``."""
    pre = Pretraining(config, languages, proc, texts)
    tokens = config.pretrain.tokens
    logger.info(
        f"pre-training the backbone ({config.model.backbone}) with masked-LM on "
        f"{', '.join(languages)}: {tokens:,} tokens, {pre.steps_for(tokens)} steps -> {folder}"
    )
    start = time.perf_counter()

    def save(budget, seen, step, lp, engine):
        meta = {
            **_meta(config, languages, budget, seen, step, lp, engine, pre.schedule_steps),
            "seconds": time.perf_counter() - start,
        }
        pre.write_checkpoint(folder, engine, meta)
        logger.info(
            f"pre-trained in {time.perf_counter() - start:.0f} s; L_p = "
            + ", ".join(f"{k} {v:.4f}" for k, v in lp.items())
        )

    pre.train(tokens, [tokens], save, log=None)


# ------------------------------------------------------------------------------------------------------
class PretrainRun:
    """``run.stage: pretrain``: checkpoints at every budget in ``run_dir/checkpoints/tokens-N/``, a log, a report."""

    def __init__(self, config: RunConfig):
        self.config = config
        self.run_dir = Path(config.run.output_dir)

    def execute(self) -> Path:
        from mtft.training.preflight import preflight_pretrain

        preflight_pretrain(self.config)  # before the process group and DeepSpeed start
        proc = init_distributed()
        quiet_progress()
        setup_console_logging(proc.is_main)
        with held_log_lines(), deepspeed_patches_undone():  # train.log gets them once the run directory is written
            return self._execute(proc)

    def _execute(self, proc: ProcessInfo) -> Path:
        config = self.config
        pre = Pretraining(config, list(config.corpus.languages), proc)
        if proc.is_main:
            create_run_dir(config)
            add_file_log(self.run_dir)
        barrier()
        p = config.pretrain
        budgets = [*p.save_at_tokens, p.tokens]
        log = MetricsLog(
            self.run_dir,
            proc.is_main,
            config.logging.trackers(),
            name=config.run.name,
            params=config.model_dump(mode="json"),
        )
        start = time.perf_counter()
        results = []

        def save(budget, seen, step, lp, engine):
            meta = {
                **_meta(config, pre.languages, budget, seen, step, lp, engine, pre.schedule_steps),
                "seconds": time.perf_counter() - start,
            }
            pre.write_checkpoint(self.run_dir / "checkpoints" / f"tokens-{budget}", engine, meta)
            log.log(
                offset[0] + step,
                "budget",
                {"tokens_budget": budget, "tokens_seen": seen, **{f"lp/{k}": v for k, v in lp.items()}},
            )
            results.append(meta)
            logger.info(f"{budget:,} tokens (step {step}): L_p = " + ", ".join(f"{k} {v:.4f}" for k, v in lp.items()))

        offset = [0]
        try:
            if p.schedule_per_budget:
                for budget in budgets:
                    logger.info(f"pre-training from scratch for {budget:,} tokens ({pre.steps_for(budget)} steps)")
                    pre.train(budget, [budget], save, log, step_offset=offset[0])
                    offset[0] += pre.steps_for(budget)
            else:
                logger.info(
                    f"pre-training for {p.tokens:,} tokens ({pre.steps_for(p.tokens)} steps), saving at "
                    + ", ".join(f"{b:,}" for b in budgets)
                )
                pre.train(p.tokens, budgets, save, log)
        finally:
            log.close()
        if proc.is_main:
            from mtft.forgetting.report import write_pretrain_report

            path = write_pretrain_report(self.run_dir, config, results, pre)
            logger.info(f"report: {path}")
        barrier()
        return self.run_dir


# ------------------------------------------------------------------------------------------------------
def backbone_pretraining(backbone: str) -> Optional[dict]:
    """The ``pretrain.json`` of a backbone this stage pre-trained (a cache entry of ``pretrain.before_finetune`` or
    a ``run.stage: pretrain`` checkpoint), or None for any other backbone (a Hub id, a folder without it)."""
    path = Path(backbone) / "pretrain.json"
    if not path.is_file():
        return None
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and "tokens_budget" in meta else None


def pretraining_summary(meta: dict) -> str:
    """One line for a run report: the backbone's token budget and whether its schedule ended there."""
    text = f"{meta['tokens_budget']:,} tokens of masked-LM pre-training ({meta.get('steps', '?')} steps"
    total, lr = meta.get("schedule_steps"), meta.get("lr_after")
    if total is not None and lr is not None:
        if meta.get("steps") == total:
            text += f", the end of its own {meta.get('scheduler', '')} schedule, learning rate {lr:g} after it"
        else:
            text += f", an intermediate checkpoint of a {total}-step {meta.get('scheduler', '')} schedule, "
            text += f"learning rate {lr:g} there"
    return text + ")"


def backbone_log_row(meta: dict) -> dict:
    """The numbers of ``pretrain.json`` for the fine-tuning run's metrics.jsonl (row kind ``backbone``), so that the
    run's own log says which budget its backbone had (the study reads it from there)."""
    keys = ("tokens_budget", "tokens_seen", "steps", "schedule_steps", "lr_after", "seed")
    row = {key: meta[key] for key in keys if isinstance(meta.get(key), (int, float))}
    row.update({f"lp/{lang}": v for lang, v in (meta.get("lp") or {}).items() if isinstance(v, (int, float))})
    return row
