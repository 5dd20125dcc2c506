"""The fine-tuning run: everything is checked first, then the run is built, then the loop runs.

Order matters for the "nothing half-written" rule: the config, the DeepSpeed JSON, the tasks and the backbone are
validated before anything heavy starts (:mod:`mtft.training.preflight`), the data and the labels before the output
directory is created or touched (:func:`mtft.training.build.build_run`), and a resume changes nothing in its run
directory (not even ``train.log``) until a checkpoint has loaded.

The parts live elsewhere: the build step in :mod:`~mtft.training.build`, the step kinds in :mod:`~mtft.training.step`
and :mod:`~mtft.training.gram_step` (each returns a :class:`~mtft.training.step.StepResult` that carries what the loop
logs), best-checkpoint selection and early stopping in :mod:`~mtft.training.selection`, the other stop conditions in
:mod:`~mtft.training.stopping`, the report's tables in :mod:`mtft.reporting.run_tables`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch
from tqdm import tqdm

from mtft.config.run_config import RunConfig
from mtft.core.atomic import write_json
from mtft.core.distributed import barrier, init_distributed
from mtft.core.errors import CheckpointError, Interrupted
from mtft.evaluation.evaluate import Evaluation, metrics_record, write_predictions
from mtft.forgetting.report import monitor_sections
from mtft.reporting.logs import MetricsLog, held_log_lines, logger, setup_console_logging
from mtft.reporting.report import Report, learnt_nothing
from mtft.reporting.run_tables import objectives_table, setup_table
from mtft.reporting.window import TrainWindow
from mtft.training import checkpoint as ckpt
from mtft.training.build import RunParts, accept, build_run
from mtft.training.engine import deepspeed_patches_undone
from mtft.training.preflight import preflight
from mtft.training.pretrain import backbone_log_row, backbone_pretraining, pretraining_summary
from mtft.training.selection import Selection
from mtft.training.setup import heads_metadata
from mtft.training.stopping import Stationarity, StopSignals, diverged, nonfinite_objectives


class Run:
    """One fine-tuning run; :meth:`execute` returns the run directory."""

    def __init__(self, config: RunConfig):
        self.config = config

    def execute(self) -> Path:
        resume_from = preflight(self.config)  # every cheap check, before the process group and DeepSpeed start
        proc = init_distributed()
        setup_console_logging(proc.is_main)
        with held_log_lines(), deepspeed_patches_undone():  # train.log: once the run is accepted (build.accept)
            parts = build_run(self.config, proc, resuming=resume_from is not None)
            return Training(self.config, parts, resuming=resume_from is not None).run()


class Training:
    """The loop over a built run: from step 0 or a checkpoint to ``training.max_steps`` or a stop condition, then the
    final checkpoint, the final evaluation, the predictions, metrics.json and the report."""

    def __init__(self, config: RunConfig, parts: RunParts, resuming: bool):
        self.config, self.parts, self.names = config, parts, parts.data.objective_names
        proc = parts.proc
        self.selection = Selection(config, parts.engine, parts.data, parts.builder, parts.run_dir, proc.is_main)
        self.stationarity = Stationarity(config.weighting)
        self.step, self.saved_step = 0, None
        resume_rows = None
        if resuming:
            resume_rows = self._resume()  # restores this rank's RNG state too
            accept(parts.run_dir, proc.is_main)
        else:
            if config.run.resume:
                logger.warning(f"--resume: {parts.run_dir} has no complete checkpoint yet; starting from step 0")
            torch.manual_seed(config.run.seed + 1 + proc.rank)  # this rank's dropout stream
        self.log = MetricsLog(
            parts.run_dir,
            proc.is_main,
            config.logging.trackers(),
            resume_step=self.step if config.run.resume else None,
            resume_rows=resume_rows,
            name=config.run.name,
            params=config.model_dump(mode="json"),
        )

    def run(self) -> Path:
        parts, log = self.parts, self.log
        pretraining = backbone_pretraining(parts.model.backbone)
        if pretraining is not None and self.step == 0:  # a resumed run keeps the row its first attempt logged
            log.log(0, "backbone", backbone_log_row(pretraining))
        try:
            parts.monitor.start(self.step, log)
            with StopSignals(parts.proc.world_size) as signals:
                self._train(signals)
            parts.monitor.end(self.step)
            self._save(force=True)  # before the final evaluation: a resume of the finished run repeats no log row
            final = self.selection.evaluate(self.step, log, final=True)
            if parts.proc.is_main:
                self._finish(final)
        finally:
            log.close()
        barrier()
        return parts.run_dir

    def _train(self, signals: StopSignals) -> None:
        cfg, parts, log, names = self.config, self.parts, self.log, self.names
        max_steps = cfg.training.max_steps
        parts.engine.train()
        show = parts.proc.is_main and cfg.logging.progress_bar
        bar = tqdm(total=max_steps, initial=self.step, desc="train", dynamic_ncols=True, disable=not show)
        window = TrainWindow(len(names))
        logger.info(
            f"training {len(names)} objectives for {max_steps} steps on {parts.proc.world_size} process(es) -> "
            f"{parts.run_dir}"
        )
        # a resumed run that had already stopped early (its last checkpoint is the stopping step) trains no further
        while self.step < max_steps and not self.selection.should_stop:
            if signals.stop():  # at a step boundary: the previous step, its logs and its save are complete
                self._interrupt(signals.received or "SIGTERM")
            lr = parts.engine.get_lr()[0]  # the rate this step uses: engine.step() moves the schedule on
            result = parts.step(self._micro_batches())
            self.step += 1
            bar.update(1)
            bad = nonfinite_objectives(result.losses, result.counts, names)
            if bad:
                log.log(self.step, "stopped", {"reason": "diverged", "objectives": bad})
                raise diverged(bad, result.losses, names, self.step, self.saved_step)
            if result.skipped:
                logger.warning(f"step {self.step} skipped: {result.skipped}")
                log.log(self.step, "skipped", {"reason": result.skipped})
                continue
            window.add(result)
            over_budget = parts.monitor.after_step(self.step)
            for kind, values in result.rows(names):  # the weighting's row, the cosines
                log.log(self.step, kind, values)
            if over_budget:
                logger.info(f"step {self.step}: the forgetting bound passed forgetting.budget; stopping")
                log.log(self.step, "stopped", {"reason": over_budget})
                break
            if self.stationarity.reached(result):
                logger.info(
                    f"step {self.step}: Pareto-stationary for {self.stationarity.patience} steps "
                    f"(||d||²/mean||g_t||² < {self.stationarity.eps:g}); stopping"
                )
                log.log(self.step, "stopped", {"reason": "pareto_stationary"})
                break
            if self.step % cfg.logging.every_steps == 0 or self.step == max_steps:
                values = window.summary(names)
                bar.set_postfix(loss=f"{values['loss']:.4f}", ex_s=f"{values['examples_per_s']:.0f}")
                log.log(self.step, "train", {**values, "lr": lr, **result.extras})
                window = TrainWindow(len(names))
            if _due(cfg.evaluation.every_steps, self.step, max_steps):
                self.selection.evaluate(self.step, log, final=False)
                if self.selection.should_stop:
                    self.selection.log_early_stop(self.step, log)
                    break
            if _due(cfg.checkpointing.every_steps, self.step, max_steps):
                self._save()
        bar.close()

    def _micro_batches(self):
        micro, parts = self.config.training.micro_batch_size, self.parts
        lo = parts.proc.rank * micro  # every rank draws the same global batch and keeps its own slice
        for _ in range(self.config.training.gradient_accumulation_steps):
            yield parts.builder.train_batch(parts.sampler.next_batch()[lo : lo + micro])

    def _interrupt(self, signal_name: str) -> None:
        """SIGTERM or Ctrl-C: save the step just finished (unless it is saved) and stop with its resume command."""
        if self.saved_step != self.step:
            self._save(force=True)
        raise Interrupted(signal_name, self.step, ckpt.step_dir(self.parts.run_dir, self.step))

    def _save(self, force: bool = False) -> None:
        parts = self.parts
        if parts.proc.world_size > 1 and parts.engine.zero_optimization_stage() < 3:
            in_sync = ckpt.ranks_in_sync(parts.engine.module)
            self.log.log(self.step, "sync", {"ranks_in_sync": in_sync})
            if not in_sync:
                logger.warning(f"step {self.step}: the ranks' weights differ")
        if force or self.config.checkpointing.every_steps:
            state = {
                "step": self.step,
                "world_size": parts.proc.world_size,  # a resume with another process count is refused (preflight)
                "sampler": parts.sampler.state_dict(),
                **self.selection.state_dict(),  # best, early_stopping
                "objectives": self.names,
                "stationary_run": self.stationarity.run,
                "forgetting": parts.monitor.state_dict(),
                "log_rows": self.log.rows,  # resume keeps exactly these rows of metrics.jsonl
            }
            keep = self.config.checkpointing.keep_last
            ckpt.save_checkpoint(
                parts.engine, parts.run_dir, self.step, state, heads_metadata(parts.data), parts.proc.rank, keep
            )
            self.saved_step = self.step

    def _resume(self) -> Optional[int]:
        """Load the newest intact checkpoint into the engine and the loop; the rows of metrics.jsonl it keeps."""
        parts = self.parts
        path, state = ckpt.resume_checkpoint(parts.engine, parts.run_dir, parts.proc.rank)
        if state.get("objectives") != self.names:
            raise CheckpointError(f"{path} was trained on objectives {state.get('objectives')}, not these")
        self.step = int(state["step"])
        self.stationarity.run = int(state.get("stationary_run", 0))
        self.selection.load_state_dict(state)
        parts.sampler.load_state_dict(state["sampler"])
        parts.monitor.load_state_dict(state.get("forgetting"))
        logger.info(f"resumed from {path} at step {self.step}")
        return state.get("log_rows")

    def _finish(self, final: Evaluation) -> None:
        cfg, parts, data = self.config, self.parts, self.parts.data
        write_predictions(parts.run_dir, cfg.evaluation.split, final.predictions)
        write_json(parts.run_dir / "metrics.json", metrics_record(self.step, final.metrics, data))
        nothing = learnt_nothing(final.metrics)
        if nothing:
            logger.warning(f"{nothing} (report.md says so too)")
        pretraining = backbone_pretraining(parts.model.backbone)
        summary = pretraining_summary(pretraining) if pretraining else None
        units = range(len(data.train_units))
        path = Report(
            cfg.run.name,
            setup_table(cfg, self.step, parts.proc.world_size, parts.engine.zero_optimization_stage(), summary),
            final.metrics,
            data.report_tables(),
            objectives=objectives_table(
                [u.key for u in data.train_units], [len(data.train_dataset(i)) for i in units], parts.mixing
            ),
            best=self.selection.best,
            parameters=parts.parameters,
            sections=monitor_sections(parts.run_dir),
        ).write(parts.run_dir)
        logger.info(f"report: {path}")


def _due(every: int, step: int, max_steps: int) -> bool:
    """Whether an every-N-steps action (evaluation, checkpoint) falls on ``step``; the last step has its own."""
    return bool(every) and step % every == 0 and step < max_steps
