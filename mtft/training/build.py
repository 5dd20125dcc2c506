"""A fine-tuning run's build step: every part the loop needs, built whole and checked before the loop starts.

:func:`build_run` resolves the backbone (``pretrain.before_finetune``, then SURT), prepares the data (rank 0 first),
builds the model, the weighting and its step, the DeepSpeed engine, the sampler and the forgetting monitor, and
writes the run directory only after every input was accepted: a bad backbone or adapter writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Optional

import datasets
import numpy as np
import torch

from mtft.adapters import build_method, parameter_table
from mtft.config.deepspeed import zero_stage
from mtft.config.run_config import RunConfig
from mtft.config.schema import AdapterSection, GradientsSection, ModelSection, WeightingSection
from mtft.core.atomic import recover
from mtft.core.distributed import ProcessInfo, barrier
from mtft.core.errors import ConfigError
from mtft.data.batching import BatchBuilder
from mtft.data.pipeline import PreparedData, prepare_data
from mtft.data.sampler import MultiObjectiveSampler, mixing_probabilities
from mtft.data.sources import one_module_per_dataset
from mtft.forgetting import build_monitor
from mtft.forgetting.monitor import Monitor, MonitorSettings, prepare_forgetting
from mtft.gradients import full_numel, row_sparse_parameters
from mtft.gradients.store import SecondBackwardStore, TapeStore
from mtft.reporting.logs import add_file_log, logger
from mtft.training.adamw_preconditioner import AdamWPreconditioner
from mtft.training.buffers import BufferChoice, buffer_bytes, choose_buffers, describe_bytes
from mtft.training.engine import finetuning_engine, initialize
from mtft.training.gradient_store import gradient_store
from mtft.training.gram_step import GramWeightedStep, StepOptions
from mtft.training.pretrain import pretrained_backbone
from mtft.training.restore import save_encoder_files
from mtft.training.rundir import create_run_dir
from mtft.training.setup import build_model, make_tokenizer_factory, shared_parameters
from mtft.training.step import LossWeightedStep, StepResult
from mtft.training.surt import surt_backbone
from mtft.training.vocabulary import reduced_backbone
from mtft.weighting import Weighting, build_weighting

if TYPE_CHECKING:  # imported by the engine's construction only where it runs (deepspeed is slow to import)
    from deepspeed import DeepSpeedEngine

#: one optimizer step over the step's micro-batches: LossWeightedStep or GramWeightedStep
Step = Callable[[Iterable[dict[str, torch.Tensor]]], StepResult]


@dataclass
class RunParts:
    """What the loop runs on, built by :func:`build_run`."""

    proc: ProcessInfo
    run_dir: Path
    model: ModelSection  # config.model with the backbone fine-tuning starts from (pre-trained, re-trained by SURT)
    data: PreparedData
    engine: DeepSpeedEngine  # around the MultiTaskModel
    step: Step
    sampler: MultiObjectiveSampler
    mixing: np.ndarray  # the sampler's probability of each training unit
    builder: BatchBuilder
    monitor: Monitor  # the forgetting monitors, or their NullMonitor
    parameters: list[tuple[str, int, int]]  # (part, stored, trainable) for the log and the report


def build_run(config: RunConfig, proc: ProcessInfo, resuming: bool) -> RunParts:
    """Every part of the run, and its run directory (a new one, or the one it resumes, left as it is)."""
    run_dir = Path(config.run.output_dir)
    datasets.disable_progress_bars()  # mtft logs one line per loaded split instead
    barrier()
    with one_module_per_dataset():  # the monitors' and pre-training's text too, beside the tasks' splits
        start = pretrained_backbone(config, proc)  # pretrain.before_finetune: the cached checkpoint
        start = surt_backbone(config, start, proc)  # stability.surt: re-trained on task text
        start = reduced_backbone(config, start, proc)  # model.vocabulary: used: cut to the run's word pieces
        data = _prepare_data_rank0_first(config, start, proc)
        forgetting = prepare_forgetting(monitor_settings(config), start, data)
    # built before the run directory: a bad backbone or adapter writes nothing
    model = build_model(config, data, start)
    weighting = build_weighting(config.weighting.method, config.weighting.options)
    shared = _shared_parameters(config.weighting, config.model.adapter, model, data) if weighting.needs_gram else None
    if proc.is_main:  # complete (config, encoder files, marker) or absent; a resumed run keeps its directory
        create_run_dir(config, lambda folder: save_encoder_files(folder, model.encoder, data.tokenizer))
    barrier()
    if not resuming:
        accept(run_dir, proc.is_main)  # a new run (or a resume before the first checkpoint): nothing left to refuse
    parameters = parameter_table(model)
    logger.info(
        f"{config.model.adapter.method}: "
        + "; ".join(f"{part} {stored:,} stored / {trainable:,} trainable" for part, stored, trainable in parameters)
    )
    engine = initialize(model, finetuning_engine(config, proc.world_size))
    builder = BatchBuilder(data)
    step = _build_step(config, engine, weighting, shared, len(data.objective_names), proc.world_size)
    sizes = [len(data.train_dataset(u)) for u in range(len(data.train_units))]
    mixing = mixing_probabilities(
        sizes, config.data.mixing.strategy, config.data.mixing.temperature, config.data.mixing.cap
    )
    kept, whole = data.train_layout()  # data.leave_out: S's order with the removed rows skipped
    batch = config.training.micro_batch_size * proc.world_size
    sampler = MultiObjectiveSampler(sizes, mixing, batch, config.run.seed, kept, whole)
    monitor = build_monitor(forgetting, engine, data, proc.is_main, run_dir)
    return RunParts(proc, run_dir, start, data, engine, step, sampler, mixing, builder, monitor, parameters)


def monitor_settings(config: RunConfig) -> MonitorSettings:
    """What the forgetting monitors read of ``config``."""
    return MonitorSettings(
        config.forgetting,
        config.corpus,
        config.data,
        log_every=config.logging.every_steps,
        replicate=zero_stage(config) == 3,
        pretrained_on_corpus=config.pretrain.before_finetune,
    )


def accept(run_dir: Path, is_main: bool) -> None:
    """The run goes ahead. Until here a resume changes nothing in the run directory, so one refused (no checkpoint
    loads, the objectives differ) leaves it as it was; now rank 0 writes the held log lines to train.log and logs
    there, and finishes a replacement of best/ that a kill interrupted."""
    if is_main:
        add_file_log(run_dir)
        recover(run_dir / "best")  # a kill between the two renames of a best/ replacement


def _prepare_data_rank0_first(config: RunConfig, start: ModelSection, proc: ProcessInfo) -> PreparedData:
    # Rank 0 trains the tokenizer and fills the datasets cache; the other ranks then read the cache.
    if not proc.is_main:
        barrier()
    make_tokenizer = make_tokenizer_factory(config, start)
    data = prepare_data(config.data, config.evaluation.split, config.weighting.objectives, make_tokenizer)
    if proc.is_main:
        barrier()
    return data


def _shared_parameters(cfg: WeightingSection, adapter: AdapterSection, model, data: PreparedData):
    shared, shared_rows = shared_parameters(model, data, cfg.shared, build_method(adapter))
    if not shared and len(data.objective_names) > 1:  # one objective: w = 1, nothing to balance
        raise ConfigError(
            f"weighting.method={cfg.method}: no trainable parameter is shared by two "
            f"objectives (weighting.shared={cfg.shared}, model.adapter.method="
            f"{adapter.method}), so there is nothing to balance; use weighting.shared=all "
            "or weighting.method=mean"
        )
    return shared, shared_rows


def _build_step(config: RunConfig, engine, weighting: Weighting, shared, num_objectives: int, world: int) -> Step:
    cfg, grads = config.weighting, config.gradients
    if not config.per_objective_gradients():
        return LossWeightedStep(engine, weighting, num_objectives, world)
    params, shared_rows = shared if shared is not None else (None, None)
    if params is not None:
        logger.info(
            f"{cfg.method}: Gram over {sum(full_numel(p) for p in params):,} shared parameters "
            f"({len(params)} tensors), {num_objectives} objectives"
        )
    metric: Optional[AdamWPreconditioner] = None
    if grads.metric == "optimizer":
        metric = AdamWPreconditioner(engine)
        if metric.adaptive:
            logger.info(f"{cfg.method}: Gram in AdamW's metric, g_tᵀ diag(1/(√v̂+ε)) g_s (Euclidean at step 1)")
        else:
            logger.info(
                f"{cfg.method}: gradients.metric=optimizer with training.optimizer.name="
                f"{config.training.optimizer.name}, which applies no preconditioner: the Euclidean Gram"
            )
    training = config.training
    tokens = training.micro_batch_size * config.data.max_length * training.gradient_accumulation_steps
    choice = _buffer_choice(grads, tokens, engine, num_objectives, world)
    logger.info(f"{cfg.method}: per-objective gradients {choice.why}")
    store = gradient_store(
        engine,
        num_objectives,
        world,
        params,
        shared_rows,
        buffers=choice.mode,
        update=grads.update,
        chunk_bytes=None if grads.chunk_mb is None else int(grads.chunk_mb * 2**20),
        micro_batches=training.gradient_accumulation_steps,
        descent_check=grads.descent_check,
    )
    if store.model.partitioned:
        logger.info(f"{cfg.method} under ZeRO-3: {store.model.partitioning()}")
    if isinstance(store, TapeStore):
        given = grads.chunk_mb
        source = f"gradients.chunk_mb={given:g}" if given is not None else "the default"
        budget = describe_bytes(store.layerwise.chunk_bytes)
        logger.info(f"{cfg.method}: a layer's products formed in chunks of at most {budget} ({source})")
        update = (
            "the Gram formed during the backward pass, the update by a second backward pass of the weighted losses"
            if isinstance(store, SecondBackwardStore)
            else "the update from a tape of the backward pass"
        )
        logger.info(f"{cfg.method}: {update} (gradients.update={grads.update})")
    return GramWeightedStep(store, weighting, StepOptions(cfg.cosine_every, metric, grads.descent_check))


def _buffer_choice(grads: GradientsSection, tokens: int, engine, num_objectives: int, world: int) -> BufferChoice:
    """``gradients.buffers`` (``auto`` resolved against the memory budget), for ``tokens`` a step."""
    trainable = [p for p in engine.module.parameters() if p.requires_grad]
    element = 2 if grads.buffers == "bfloat16" else 4
    needed = buffer_bytes(trainable, row_sparse_parameters(engine.module), num_objectives, world, tokens, element)
    return choose_buffers(grads.buffers, needed, grads.budget_gb, engine.device, num_objectives)
