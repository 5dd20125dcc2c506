"""Evaluation during training: the best checkpoint (``best/``) and early stopping on ``evaluation.metric_for_best``.

An evaluation during training selects ``best/`` and drives early stopping (:class:`EarlyStopping`); with
``data.dev_split`` it scores the held-out dev set (logged as "dev" rows), and ``evaluation.split`` is scored once,
at the end, as the test set (logged as "eval" rows), never selecting anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from mtft.config.run_config import RunConfig
from mtft.core.atomic import AtomicFolder, write_json
from mtft.core.distributed import barrier
from mtft.data.batching import BatchBuilder
from mtft.data.pipeline import PreparedData
from mtft.data.selection import selection_metric
from mtft.evaluation.evaluate import Evaluation, evaluate, metrics_record
from mtft.evaluation.majority import MAJORITY, majority_baselines
from mtft.models.multihead import average_heads
from mtft.reporting.logs import MetricsLog, logger
from mtft.training import checkpoint as ckpt
from mtft.training.early_stopping import EarlyStopping
from mtft.training.setup import heads_metadata


class Selection:
    """Scores the run's model, keeps the best evaluation so far (``best``: metric, value, step) and its weights in
    ``best/``, and counts the evaluations without improvement. Its state travels in the training checkpoint."""

    def __init__(
        self, config: RunConfig, engine, data: PreparedData, builder: BatchBuilder, run_dir: Path, is_main: bool
    ):
        self.cfg, self.dev_split = config.evaluation, config.data.dev_split
        self.engine, self.data, self.builder, self.run_dir, self.is_main = engine, data, builder, run_dir, is_main
        self.early_stopping = EarlyStopping(self.cfg.early_stopping_patience, self.cfg.greater_is_better)
        self.best: Optional[dict[str, Any]] = None
        self.dev_scored_step: Optional[int] = None  # an early stop has scored the dev set at this step
        self.baselines: dict[bool, dict[str, float]] = {}  # dev? -> the majority-class baseline's metrics

    @property
    def should_stop(self) -> bool:
        return self.early_stopping.should_stop

    def evaluate(self, step: int, log: MetricsLog, final: bool) -> Evaluation:
        """During training (``final`` false) the evaluation that selects; at the end, the test set's."""
        if self.dev_split is None:
            return self._select(step, self._score(step, log, dev=False), dev=False)
        if not (final and self.dev_scored_step == step):  # an early stop has just scored this step
            self.dev_scored_step = step
            selection = self._select(step, self._score(step, log, dev=True), dev=True)
            if not final:
                return selection
        return self._score(step, log, dev=False)

    def log_early_stop(self, step: int, log: MetricsLog) -> None:
        best = self.best or {}
        patience = self.cfg.early_stopping_patience
        logger.info(
            f"step {step}: {self.cfg.metric_for_best} did not improve for {patience} evaluation(s) "
            f"(best {best.get('value', float('nan')):.4f} at step {best.get('step')}); stopping early"
        )
        log.log(step, "stopped", {"reason": "early_stopping", "patience": patience, "best_step": best.get("step")})

    def state_dict(self) -> dict[str, Any]:
        """Keys of the trainer state (:func:`mtft.training.checkpoint.save_checkpoint`)."""
        return {"best": self.best, "early_stopping": self.early_stopping.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best = state.get("best")
        self.early_stopping.load_state_dict(state.get("early_stopping"))
        if state.get("early_stopping") is None and self.best is not None:  # a checkpoint from before early stopping
            self.early_stopping.best = self.best["value"]

    def _score(self, step: int, log: MetricsLog, dev: bool) -> Evaluation:
        result = evaluate(self.engine.module, self.data, self.builder, self.cfg.batch_size, self.engine.device, dev=dev)
        result.metrics.update(self._baselines(dev))
        log.log(step, "dev" if dev else "eval", result.metrics)
        summary = ", ".join(
            f"{k}={v:.4f}" for k, v in result.metrics.items() if k.count("/") == 1 and f"/{MAJORITY}" not in k
        )
        logger.info(f"step {step}: {'dev ' if dev else ''}{summary}")
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

    def _select(self, step: int, result: Evaluation, dev: bool) -> Evaluation:
        if self.cfg.metric_for_best:
            # evaluation.select_on: the macro over the source languages by default (never a target's labels)
            tasks = self.data.tasks.items()
            key = selection_metric(
                self.cfg, {n: td.languages for n, td in tasks}, {n: td.targets for n, td in tasks}, dev
            )
            value = result.metrics[key]
            if self.early_stopping.update(value):  # strictly better than the best so far (or the first)
                self.best = {"metric": key, "value": value, "step": step}
                self._save_best(step, result)
        return result

    def _save_best(self, step: int, result: Evaluation) -> None:
        # MHLoss: best/ holds the averaged head, an ordinary single head (training checkpoints keep all H)
        state = average_heads(ckpt.full_state_dict(self.engine), self.engine.module)
        if self.is_main:
            with AtomicFolder(self.run_dir / "best").writing(kind="best", step=step) as folder:
                ckpt.write_weights(state, heads_metadata(self.data), folder)
                write_json(folder / "metrics.json", metrics_record(step, result.metrics, self.data))
        barrier()
