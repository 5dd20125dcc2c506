"""The fine-tuning run: everything is checked first, then the run directory is written, then the loop runs.

Order matters for the "nothing half-written" rule: the config, the DeepSpeed JSON, the tasks and the backbone are
validated before anything heavy starts (:mod:`mtft.training.preflight`), the data and the labels before the output
directory is created or touched, and a resume changes nothing in its run directory (not even ``train.log``) until
a checkpoint has loaded.
"""

from __future__ import annotations

import math
import signal
import time
from pathlib import Path
from typing import Any, Optional

import datasets
import torch
from tqdm import tqdm

from mtft.adapters import build_method, parameter_table
from mtft.config.schema import RunConfig
from mtft.core.atomic import AtomicFolder, recover, write_json
from mtft.core.distributed import barrier, init_distributed
from mtft.core.errors import CheckpointError, ConfigError, Diverged, Interrupted
from mtft.data.batching import BatchBuilder
from mtft.data.pipeline import PreparedData, prepare_data
from mtft.data.sampler import MultiObjectiveSampler, mixing_probabilities
from mtft.data.selection import selection_metric
from mtft.evaluation.evaluate import Evaluation, evaluate, metrics_record, write_predictions
from mtft.evaluation.majority import MAJORITY, majority_baselines
from mtft.forgetting import build_monitor
from mtft.forgetting.monitor import prepare_forgetting
from mtft.forgetting.report import monitor_sections
from mtft.gradients import full_numel
from mtft.models.multihead import average_heads
from mtft.reporting.logs import MetricsLog, add_file_log, held_log_lines, logger, setup_console_logging
from mtft.reporting.report import write_report
from mtft.training import checkpoint as ckpt
from mtft.training.adamw_preconditioner import OptimizerMetric
from mtft.training.early_stopping import EarlyStopping
from mtft.training.engine import initialize
from mtft.training.gram_step import GramWeightedStep
from mtft.training.preflight import preflight
from mtft.training.pretrain import backbone_log_row, backbone_pretraining, pretrained_backbone, pretraining_summary
from mtft.training.restore import save_encoder_files
from mtft.training.rundir import create_run_dir
from mtft.training.setup import build_model, heads_metadata, make_tokenizer_factory, shared_parameters
from mtft.training.step import LossWeightedStep
from mtft.training.surt import surt_backbone
from mtft.weighting import build_weighting


class _Window:
    """Training statistics averaged over the steps since the last log line."""

    def __init__(self, num_objectives: int):
        self.start = time.perf_counter()
        self.steps = self.examples = 0
        self.loss = 0.0
        self.sums = torch.zeros(num_objectives, dtype=torch.float64)
        self.counts = torch.zeros(num_objectives, dtype=torch.float64)
        self.weights = torch.zeros(num_objectives, dtype=torch.float64)

    def add(self, result) -> None:
        self.steps += 1
        self.examples += result.examples
        self.loss += result.loss
        self.sums += torch.nan_to_num(result.losses) * result.counts
        self.counts += result.counts
        self.weights += result.weights

    def summary(self, names: list[str]) -> dict[str, Any]:
        values: dict[str, Any] = {
            "loss": self.loss / self.steps,
            "examples_per_s": self.examples / max(time.perf_counter() - self.start, 1e-9),
        }
        means = (self.sums / self.counts).tolist()  # nan for an objective absent from the whole window
        for name, loss, weight in zip(names, means, (self.weights / self.steps).tolist()):
            values[f"loss/{name}"] = loss
            values[f"weight/{name}"] = weight
        return values


class Run:
    """One fine-tuning run; :meth:`execute` returns the run directory."""

    def __init__(self, config: RunConfig):
        self.config = config
        self.run_dir = Path(config.run.output_dir)

    # ------------------------------------------------------------------------------------------------
    def execute(self) -> Path:
        resume_from = preflight(self.config)  # every cheap check, before the process group and DeepSpeed start
        self.proc = init_distributed()
        setup_console_logging(self.proc.is_main)
        with held_log_lines():  # train.log gets them once the run is accepted (_accept)
            return self._execute(resume_from)

    def _execute(self, resume_from: Optional[Path]) -> Path:
        config = self.config
        datasets.disable_progress_bars()  # mtft logs one line per loaded split instead
        barrier()
        self.model_config = pretrained_backbone(config, self.proc)  # pretrain.before_finetune: the cached checkpoint
        self.model_config = surt_backbone(self.model_config, self.proc)  # stability.surt: re-trained on task text
        self.data = self._prepare_data_rank0_first()
        forgetting = prepare_forgetting(config, self.model_config, self.data)
        # built before the run directory: a bad backbone or adapter writes nothing
        model = build_model(self.model_config, self.data)
        self.weighting = build_weighting(config.weighting.method, config.weighting.options)
        self.shared = self._shared_parameters(model) if self.weighting.needs_gram else None
        self._create_run_dir(model)
        if resume_from is None:
            self._accept()  # a new run (or a resume before the first checkpoint): nothing left to refuse
        self.parameters = parameter_table(model)
        logger.info(
            f"{config.model.adapter.method}: "
            + "; ".join(
                f"{part} {stored:,} stored / {trainable:,} trainable" for part, stored, trainable in self.parameters
            )
        )
        self.engine = initialize(model, config, self.proc.world_size)
        self.builder = BatchBuilder(self.data)
        self.step_fn = self._build_step()
        self.sampler = self._sampler()
        self.step, self.best, self.stationary_run, self.dev_scored_step = 0, None, 0, None
        self.baselines: dict[bool, dict[str, float]] = {}  # dev? -> the majority-class baseline's metrics
        self.early_stopping = EarlyStopping(
            config.evaluation.early_stopping_patience, config.evaluation.greater_is_better
        )
        self.monitor = build_monitor(forgetting, config, self.engine, self.data, self.proc.is_main, self.run_dir)
        self.resume_rows, self.saved_step, self.stop_signal = None, None, None
        if resume_from is not None:
            self._resume(resume_from)  # restores this rank's RNG state too
            self._accept()
        else:
            if config.run.resume:
                logger.warning(f"--resume: {self.run_dir} has no complete checkpoint yet; starting from step 0")
            torch.manual_seed(config.run.seed + 1 + self.proc.rank)  # this rank's dropout stream
        self.log = MetricsLog(
            self.run_dir,
            self.proc.is_main,
            config.logging.tensorboard,
            resume_step=self.step if config.run.resume else None,
            resume_rows=self.resume_rows,
        )
        pretraining = backbone_pretraining(self.model_config.model.backbone)
        if pretraining is not None and self.step == 0:  # a resumed run keeps the row its first attempt logged
            self.log.log(0, "backbone", backbone_log_row(pretraining))
        try:
            self.monitor.start(self.step, self.log)
            self._train()
            self.monitor.end(self.step)
            self._save(force=True)  # before the final evaluation: a resume of the finished run repeats no log row
            final = self._evaluate(final=True)
            if self.proc.is_main:
                self._finish(final)
        finally:
            self.log.close()
        barrier()
        return self.run_dir

    # ------------------------------------------------------------------------------------------------
    def _prepare_data_rank0_first(self) -> PreparedData:
        # Rank 0 trains the tokenizer and fills the datasets cache; the other ranks then read the cache.
        if not self.proc.is_main:
            barrier()
        data = prepare_data(self.config, make_tokenizer_factory(self.model_config))
        if self.proc.is_main:
            barrier()
        return data

    def _create_run_dir(self, model) -> None:
        """A new run directory appears complete (config, encoder files, marker) or not at all; with
        run.overwrite it replaces the previous run in one rename. A resumed run keeps its directory."""
        if self.proc.is_main:
            create_run_dir(self.config, lambda folder: save_encoder_files(folder, model.encoder, self.data.tokenizer))
        barrier()

    def _accept(self) -> None:
        """The run goes ahead. Until here a resume changes nothing in the run directory, so one refused (no
        checkpoint loads, the objectives differ) leaves it as it was; now rank 0 writes the held log lines to
        train.log and logs there, and finishes a replacement of best/ that a kill interrupted."""
        if self.proc.is_main:
            add_file_log(self.run_dir)
            recover(self.run_dir / "best")  # a kill between the two renames of a best/ replacement

    def _shared_parameters(self, model):
        shared, shared_rows = shared_parameters(
            model, self.data, self.config.weighting.shared, build_method(self.config.model.adapter)
        )
        if not shared and len(self.data.objective_names) > 1:  # one objective: w = 1, nothing to balance
            raise ConfigError(
                f"weighting.method={self.config.weighting.method}: no trainable parameter is shared by two "
                f"objectives (weighting.shared={self.config.weighting.shared}, model.adapter.method="
                f"{self.config.model.adapter.method}), so there is nothing to balance; use weighting.shared=all "
                "or weighting.method=mean"
            )
        return shared, shared_rows

    def _build_step(self):
        cfg, num_objectives, world = self.config.weighting, len(self.data.objective_names), self.proc.world_size
        if not cfg.per_objective_gradients():
            return LossWeightedStep(self.engine, self.weighting, num_objectives, world)
        shared, shared_rows = self.shared if self.shared is not None else (None, None)
        if shared is not None:
            logger.info(
                f"{cfg.method}: Gram over {sum(full_numel(p) for p in shared):,} shared parameters "
                f"({len(shared)} tensors), {num_objectives} objectives"
            )
        metric = None
        if cfg.metric == "optimizer":
            metric = OptimizerMetric(self.engine)
            if metric.adaptive:
                logger.info(f"{cfg.method}: Gram in AdamW's metric, g_tᵀ diag(1/(√v̂+ε)) g_s (Euclidean at step 1)")
            else:
                logger.info(
                    f"{cfg.method}: weighting.metric=optimizer with training.optimizer.name="
                    f"{self.config.training.optimizer.name}, which applies no preconditioner: the Euclidean Gram"
                )
        return GramWeightedStep(
            self.engine,
            self.weighting,
            num_objectives,
            world,
            shared,
            cfg.cosine_every,
            shared_rows,
            metric=metric,
            descent_check=cfg.descent_check,
            buffer_dtype=torch.bfloat16 if cfg.gradient_buffers == "bfloat16" else None,
        )

    def _sampler(self) -> MultiObjectiveSampler:
        mixing = self.config.data.mixing
        sizes = [len(self.data.train_dataset(u)) for u in range(len(self.data.train_units))]
        self.mix = mixing_probabilities(sizes, mixing.strategy, mixing.temperature, mixing.cap)
        batch = self.config.training.micro_batch_size * self.proc.world_size
        kept, whole = self.data.train_layout()  # data.leave_out: S's order with the removed rows skipped
        return MultiObjectiveSampler(sizes, self.mix, batch, self.config.run.seed, kept, whole)

    def _micro_batches(self):
        micro = self.config.training.micro_batch_size
        lo = self.proc.rank * micro  # every rank draws the same global batch and keeps its own slice
        for _ in range(self.config.training.gradient_accumulation_steps):
            yield self.builder.train_batch(self.sampler.next_batch()[lo : lo + micro])

    # ------------------------------------------------------------------------------------------------
    def _train(self) -> None:
        cfg = self.config
        self.engine.train()
        bar = tqdm(
            total=cfg.training.max_steps,
            initial=self.step,
            desc="train",
            dynamic_ncols=True,
            disable=not (self.proc.is_main and cfg.logging.progress_bar),
        )
        window = _Window(len(self.data.objective_names))
        logger.info(
            f"training {len(self.data.objective_names)} objectives for {cfg.training.max_steps} steps "
            f"on {self.proc.world_size} process(es) -> {self.run_dir}"
        )
        handlers = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            self._train_steps(bar, window)
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
        bar.close()

    def _on_signal(self, signum, frame) -> None:
        """SIGTERM or Ctrl-C: finish the current step, save, stop (:meth:`_stop_if_signalled`); a second one of
        either kind acts as if mtft had not caught it (Ctrl-C raises KeyboardInterrupt, SIGTERM ends the process)."""
        self.stop_signal = signal.Signals(signum).name
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def _stop_if_signalled(self) -> None:
        stop = self.stop_signal is not None
        if self.proc.world_size > 1:  # every rank stops after the same step, or the collectives would hang
            flag = torch.tensor([int(stop)])
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            stop = bool(flag.item())
        if not stop:
            return
        if self.saved_step != self.step:
            self._save(force=True)
        path = ckpt.step_dir(self.run_dir, self.step)
        raise Interrupted(self.stop_signal or "SIGTERM", self.step, path)

    def _train_steps(self, bar, window) -> None:
        cfg = self.config
        # a resumed run that had already stopped early (its last checkpoint is the stopping step) trains no further
        while self.step < cfg.training.max_steps and not self.early_stopping.should_stop:
            self._stop_if_signalled()  # at a step boundary: the previous step, its logs and its save are complete
            lr = self.engine.get_lr()[0]  # the rate this step uses: engine.step() moves the schedule on
            result = self.step_fn(self._micro_batches())
            self.step += 1
            bar.update(1)
            self._stop_if_diverged(result)
            if result.extras.get("skipped"):
                logger.warning(f"step {self.step} skipped: {self.step_fn.skip_reason}")
                self.log.log(self.step, "skipped", {"reason": self.step_fn.skip_reason})
                continue
            window.add(result)
            stop = self.monitor.after_step(self.step)
            if isinstance(self.step_fn, GramWeightedStep):  # weights, ||d||², the certificate, g_tᵀΔθ: every step
                names = self.data.objective_names
                values = {f"weight/{n}": w for n, w in zip(names, result.weights.tolist())}
                if result.first_order is not None:
                    values.update({f"first_order/{n}": c for n, c in zip(names, result.first_order.tolist())})
                self.log.log(self.step, "weighting", {**values, **result.extras})
            if getattr(self.step_fn, "last_cosines", None) is not None:
                self.log.log(
                    self.step, "cosines", {"objectives": self.data.objective_names, "matrix": self.step_fn.last_cosines}
                )
                self.step_fn.last_cosines = None
            if stop:
                logger.info(f"step {self.step}: the forgetting bound passed forgetting.budget; stopping")
                self.log.log(self.step, "stopped", {"reason": stop})
                break
            if self._stationary(result):
                logger.info(
                    f"step {self.step}: Pareto-stationary for {cfg.weighting.stationarity_patience} steps "
                    f"(||d||²/mean||g_t||² < {cfg.weighting.stationarity_eps:g}); stopping"
                )
                self.log.log(self.step, "stopped", {"reason": "pareto_stationary"})
                break
            if self.step % cfg.logging.every_steps == 0 or self.step == cfg.training.max_steps:
                values = window.summary(self.data.objective_names)
                bar.set_postfix(loss=f"{values['loss']:.4f}", ex_s=f"{values['examples_per_s']:.0f}")
                self.log.log(self.step, "train", {**values, "lr": lr, **result.extras})
                window = _Window(len(self.data.objective_names))
            every = cfg.evaluation.every_steps
            if every and self.step % every == 0 and self.step < cfg.training.max_steps:
                self._evaluate(final=False)
                if self.early_stopping.should_stop:
                    self._stop_early()
                    break
            every = cfg.checkpointing.every_steps
            if every and self.step % every == 0 and self.step < cfg.training.max_steps:
                self._save()

    def _stop_if_diverged(self, result) -> None:
        """A non-finite loss ends the run with one line, rather than training on NaN weights to a report of NaN
        metrics and exit status 0. Every rank sees the same (all-reduced) losses, so every rank stops here."""
        names = self.data.objective_names
        bad = nonfinite_objectives(result.losses, result.counts, names)
        if not bad:
            return
        self.log.log(self.step, "stopped", {"reason": "diverged", "objectives": bad})
        value = float(result.losses[names.index(bad[0])])
        saved = f"the last checkpoint is step {self.saved_step}" if self.saved_step else "no checkpoint was saved"
        raise Diverged(
            f"training diverged at step {self.step}: the loss of {bad[0]} is {value}"
            f"{f' ({len(bad)} of {len(names)} objectives non-finite)' if len(bad) > 1 else ''}; {saved}. "
            "Lower training.optimizer.lr or keep training.gradient_clipping on, and start again"
        )

    def _stop_early(self) -> None:
        cfg = self.config.evaluation
        best = self.best or {}
        logger.info(
            f"step {self.step}: {cfg.metric_for_best} did not improve for {cfg.early_stopping_patience} evaluation(s) "
            f"(best {best.get('value', float('nan')):.4f} at step {best.get('step')}); stopping early"
        )
        self.log.log(
            self.step,
            "stopped",
            {"reason": "early_stopping", "patience": cfg.early_stopping_patience, "best_step": best.get("step")},
        )

    def _stationary(self, result) -> bool:
        eps = self.config.weighting.stationarity_eps
        if eps is None or "stationarity" not in result.extras:
            return False
        self.stationary_run = self.stationary_run + 1 if result.extras["stationarity"] < eps else 0
        return self.stationary_run >= self.config.weighting.stationarity_patience

    def _evaluate(self, final: bool) -> Evaluation:
        """An evaluation during training selects best/ and drives early stopping; with data.dev_split it scores
        the held-out dev set (logged as "dev" rows), and evaluation.split is scored once, at the end, as the test
        set (logged as "eval" rows), never selecting anything."""
        if self.config.data.dev_split is None:
            return self._select_best(self._score(dev=False), dev=False)
        if not (final and self.dev_scored_step == self.step):  # an early stop has just scored this step
            self.dev_scored_step = self.step
            selection = self._select_best(self._score(dev=True), dev=True)
            if not final:
                return selection
        return self._score(dev=False)

    def _score(self, dev: bool) -> Evaluation:
        cfg = self.config.evaluation
        result = evaluate(self.engine.module, self.data, self.builder, cfg.batch_size, self.engine.device, dev=dev)
        result.metrics.update(self._baselines(dev))
        self.log.log(self.step, "dev" if dev else "eval", result.metrics)
        summary = ", ".join(
            f"{k}={v:.4f}" for k, v in result.metrics.items() if k.count("/") == 1 and f"/{MAJORITY}" not in k
        )
        logger.info(f"step {self.step}: {'dev ' if dev else ''}{summary}")
        return result

    def _baselines(self, dev: bool) -> dict[str, float]:
        """The majority-class baseline of the split scored (labels only: computed once per run and split), written
        beside the model's metrics in every evaluation row, ``best/metrics.json`` and ``metrics.json``."""
        if dev not in self.baselines:
            self.baselines[dev] = majority_baselines(self.data, dev)
            macro = ", ".join(f"{k}={v:.4f}" for k, v in self.baselines[dev].items() if k.count("/") == 1)
            if macro:
                logger.info(f"majority-class baseline{' (dev)' if dev else ''}: {macro}")
        return self.baselines[dev]

    def _select_best(self, result: Evaluation, dev: bool) -> Evaluation:
        cfg = self.config.evaluation
        if cfg.metric_for_best:
            # evaluation.select_on: the macro over the source languages by default (never a target's labels)
            key = selection_metric(
                cfg,
                {name: td.languages for name, td in self.data.tasks.items()},
                {name: td.targets for name, td in self.data.tasks.items()},
                dev,
            )
            value = result.metrics[key]
            if self.early_stopping.update(value):  # strictly better than the best so far (or the first)
                self.best = {"metric": key, "value": value, "step": self.step}
                self._save_best(result)
        return result

    def _save_best(self, result: Evaluation) -> None:
        # MHLoss: best/ holds the averaged head, an ordinary single head (training checkpoints keep all H)
        state = average_heads(ckpt.full_state_dict(self.engine), self.engine.module)
        if self.proc.is_main:
            with AtomicFolder(self.run_dir / "best").writing(kind="best", step=self.step) as folder:
                ckpt.write_weights(state, heads_metadata(self.data), folder)
                write_json(folder / "metrics.json", metrics_record(self.step, result.metrics, self.data))
        barrier()

    def _trainer_state(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "world_size": self.proc.world_size,  # a resume with another process count is refused (preflight)
            "sampler": self.sampler.state_dict(),
            "best": self.best,
            "objectives": self.data.objective_names,
            "stationary_run": self.stationary_run,
            "early_stopping": self.early_stopping.state_dict(),
            "forgetting": self.monitor.state_dict(),
            "log_rows": self.log.rows,  # resume keeps exactly these rows of metrics.jsonl
        }

    def _save(self, force: bool = False) -> None:
        if self.proc.world_size > 1 and self.engine.zero_optimization_stage() < 3:
            in_sync = ckpt.ranks_in_sync(self.engine.module)
            self.log.log(self.step, "sync", {"ranks_in_sync": in_sync})
            if not in_sync:
                logger.warning(f"step {self.step}: the ranks' weights differ")
        if force or self.config.checkpointing.every_steps:
            ckpt.save_checkpoint(
                self.engine,
                self.run_dir,
                self.step,
                self._trainer_state(),
                heads_metadata(self.data),
                self.proc.rank,
                self.config.checkpointing.keep_last,
            )
            self.saved_step = self.step

    def _resume(self, path: Path) -> None:
        path, state = ckpt.resume_checkpoint(self.engine, self.run_dir, self.proc.rank)  # newest intact one
        if state.get("objectives") != self.data.objective_names:
            raise CheckpointError(f"{path} was trained on objectives {state.get('objectives')}, not these")
        self.step, self.best = int(state["step"]), state.get("best")
        self.stationary_run = int(state.get("stationary_run", 0))
        self.early_stopping.load_state_dict(state.get("early_stopping"))
        if state.get("early_stopping") is None and self.best is not None:  # a checkpoint from before early stopping
            self.early_stopping.best = self.best["value"]
        self.resume_rows = state.get("log_rows")
        self.sampler.load_state_dict(state["sampler"])
        self.monitor.load_state_dict(state.get("forgetting"))
        logger.info(f"resumed from {path} at step {self.step}")

    def _finish(self, final: Evaluation) -> None:
        cfg = self.config
        write_predictions(self.run_dir, cfg.evaluation.split, final.predictions)
        write_json(self.run_dir / "metrics.json", metrics_record(self.step, final.metrics, self.data))
        objectives = [
            {"name": unit.key, "examples": len(self.data.train_dataset(i)), "probability": float(self.mix[i])}
            for i, unit in enumerate(self.data.train_units)
        ]
        pretraining = backbone_pretraining(self.model_config.model.backbone)
        setup = [
            ("backbone", cfg.model.backbone),
            *([("backbone pre-training", pretraining_summary(pretraining))] if pretraining else []),
            ("method", cfg.model.adapter.method),
            (
                "weighting",
                f"{cfg.weighting.method} over {cfg.weighting.objectives}{_options_text(cfg.weighting.options)}"
                + ("" if cfg.weighting.metric == "euclidean" else f", Gram in the {cfg.weighting.metric}'s metric"),
            ),
            ("optimizer", f"{cfg.training.optimizer.name}, lr {cfg.training.optimizer.lr:g}"),
            ("steps", str(self.step)),
            ("processes", str(self.proc.world_size)),
            (
                "global batch",
                str(cfg.training.micro_batch_size * cfg.training.gradient_accumulation_steps * self.proc.world_size),
            ),
            ("DeepSpeed", f"{cfg.training.deepspeed_config} (ZeRO stage {self.engine.zero_optimization_stage()})"),
            ("evaluation split", cfg.evaluation.split),
            *(
                [("dev split", f"{cfg.data.dev_split:g} of each training split (seed {cfg.data.dev_split_seed})")]
                if cfg.data.dev_split is not None
                else []
            ),
        ]
        path = write_report(
            self.run_dir,
            cfg.run.name,
            setup,
            objectives,
            final.metrics,
            self.best,
            {name: list(td.task.metrics) for name, td in self.data.tasks.items()},
            {name: td.languages for name, td in self.data.tasks.items()},
            targets={name: td.targets for name, td in self.data.tasks.items()},
            parameters=self.parameters,
            sections=monitor_sections(self.run_dir),
            variants={name: td.task.metric_description() for name, td in self.data.tasks.items()},
        )
        logger.info(f"report: {path}")


def nonfinite_objectives(losses: torch.Tensor, counts: torch.Tensor, names: list[str]) -> list[str]:
    """The objectives present in a step (count > 0) whose loss is NaN or infinite; an absent one's NaN is not."""
    return [
        n for n, loss, count in zip(names, losses.tolist(), counts.tolist()) if count > 0 and not math.isfinite(loss)
    ]


def _options_text(options: dict[str, Any]) -> str:
    """``weighting.options`` for the report's setup table, e.g. " (floor=0.1, normalize=none)"; "" when empty."""
    return f" ({', '.join(f'{k}={v}' for k, v in sorted(options.items()))})" if options else ""
