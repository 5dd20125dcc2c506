"""The fine-tuning run report's tables (:class:`mtft.reporting.report.Report` lays them out): its set-up and
its training objectives."""

from __future__ import annotations

from typing import Any, Optional, Sequence


def setup_table(
    config: Any, steps: int, processes: int, zero_stage: int, pretraining: Optional[str]
) -> list[tuple[str, str]]:
    """The "Setup" table of a run: ``config`` its :class:`~mtft.config.run_config.RunConfig` (read by field name:
    reporting sits below the config layer), ``steps`` those trained, ``pretraining`` the backbone's pre-training in
    words (:func:`mtft.training.pretrain.pretraining_summary`) or None."""
    training, weighting, gradients, data = config.training, config.weighting, config.gradients, config.data
    global_batch = training.micro_batch_size * training.gradient_accumulation_steps * processes
    metric = "" if gradients.metric == "euclidean" else f", Gram in the {gradients.metric}'s metric"
    return [
        ("backbone", config.model.backbone),
        *([("backbone pre-training", pretraining)] if pretraining else []),
        ("method", config.model.adapter.method),
        ("weighting", f"{weighting.method} over {weighting.objectives}{options_text(weighting.options)}{metric}"),
        ("optimizer", f"{training.optimizer.name}, lr {training.optimizer.lr:g}"),
        ("steps", str(steps)),
        ("processes", str(processes)),
        ("global batch", str(global_batch)),
        ("DeepSpeed", f"{training.deepspeed_config} (ZeRO stage {zero_stage})"),
        ("evaluation split", config.evaluation.split),
        *(
            [("dev split", f"{data.dev_split:g} of each training split (seed {data.dev_split_seed})")]
            if data.dev_split is not None
            else []
        ),
    ]


def options_text(options: dict[str, Any]) -> str:
    """``weighting.options`` for the setup table, e.g. " (floor=0.1, normalize=none)"; "" when empty."""
    return f" ({', '.join(f'{k}={v}' for k, v in sorted(options.items()))})" if options else ""


def objectives_table(names: Sequence[str], examples: Sequence[int], probabilities: Sequence[float]) -> list[dict]:
    """The "Training objectives" rows: each training unit's examples and mixing probability."""
    return [
        {"name": name, "examples": count, "probability": float(p)}
        for name, count, p in zip(names, examples, probabilities)
    ]
