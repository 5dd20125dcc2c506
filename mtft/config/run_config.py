"""The whole run's configuration: one field per section of :mod:`mtft.config.schema`, and the rules that read
more than one section.

Only the orchestration (``mtft.training``, ``mtft.api``, ``mtft.commands``, ``mtft.study``, the CLI) takes a
:class:`RunConfig`; everything below it is handed the sections it reads (an import-linter contract in setup.cfg).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from mtft.config.bufferless import second_backward_refusal
from mtft.config.schema import (
    CheckpointSection,
    CorpusSection,
    DataSection,
    EvaluationSection,
    ForgettingSection,
    GradientsSection,
    LoggingSection,
    ModelSection,
    PretrainSection,
    RunSection,
    Section,
    StabilitySection,
    TrainingSection,
    WeightingSection,
)


def _section(section: type[Section]) -> Any:
    """A section of the run, built from its defaults where the file leaves it out; described (``run.py --help``) by
    the first line of its class's docstring."""
    return Field(default_factory=section, description=_summary(section))


def _summary(section: type[Section]) -> str:
    lines = (section.__doc__ or "").strip().splitlines()
    if not lines:  # a developer's mistake, met when mtft is imported
        raise TypeError(f"{section.__name__} needs a docstring: its first line describes the section in --help")
    return lines[0]


class RunConfig(Section):
    run: RunSection = _section(RunSection)
    model: ModelSection = _section(ModelSection)
    data: DataSection = Field(..., description=_summary(DataSection))
    weighting: WeightingSection = _section(WeightingSection)
    gradients: GradientsSection = _section(GradientsSection)
    training: TrainingSection = _section(TrainingSection)
    evaluation: EvaluationSection = _section(EvaluationSection)
    checkpointing: CheckpointSection = _section(CheckpointSection)
    logging: LoggingSection = _section(LoggingSection)
    corpus: CorpusSection = _section(CorpusSection)
    pretrain: PretrainSection = _section(PretrainSection)
    forgetting: ForgettingSection = _section(ForgettingSection)
    stability: StabilitySection = _section(StabilitySection)

    @model_validator(mode="after")
    def _stage_needs(self) -> "RunConfig":
        if self.run.stage == "finetune" and not self.data.tasks:
            raise ValueError("data.tasks must list at least one task for run.stage=finetune")
        if self.run.stage == "pretrain" and not self.corpus.languages:
            raise ValueError("corpus.languages must list the languages to pre-train on for run.stage=pretrain")
        if self.run.stage == "pretrain" and self.pretrain.before_finetune:
            raise ValueError("pretrain.before_finetune applies to run.stage=finetune only")
        if self.stability.surt.enabled and self.run.stage != "finetune":
            raise ValueError("stability.surt applies to run.stage=finetune only")
        if self.stability.surt.enabled and self.model.backbone == "tiny" and not self.pretrain.before_finetune:
            raise ValueError(
                "stability.surt re-trains a pre-trained backbone, not the random tiny one: set pretrain.before_finetune"
            )
        return self

    @model_validator(mode="after")
    def _gram_weighting_supports_adapter(self) -> "RunConfig":
        from mtft.adapters import get_method
        from mtft.weighting import weighting_class

        method = get_method(self.model.adapter.method)
        if not method.supports_gram and weighting_class(self.weighting.method).needs_gram:
            raise ValueError(
                f"weighting.method={self.weighting.method} needs per-objective gradients, {method.gram_refusal}"
            )
        if not method.supports_gram and self.gradients.descent_check:
            raise ValueError(
                "gradients.descent_check=true needs per-objective gradients, which model.adapter.method="
                f"{self.model.adapter.method} does not provide; set gradients.descent_check=false"
            )
        return self

    @model_validator(mode="after")
    def _metric_needs_gram(self) -> "RunConfig":
        """``gradients.metric`` is the Gram's inner product: another than the Euclidean one needs a weighting that
        reads a Gram."""
        from mtft.weighting import weighting_class

        metric, method = self.gradients.metric, self.weighting.method
        if metric != "euclidean" and not weighting_class(method).needs_gram:
            raise ValueError(
                f"gradients.metric={metric} is the inner product of the Gram, and weighting.method={method} reads no "
                "Gram; use gradients.metric=euclidean, or a weighting such as lfmlf"
            )
        return self

    def per_objective_gradients(self) -> bool:
        """Whether the step forms per-objective gradients: for the Gram (``weighting.method``), or for the descent
        check (``gradients.descent_check``)."""
        from mtft.weighting import weighting_class

        return weighting_class(self.weighting.method).needs_gram or self.gradients.descent_check

    @model_validator(mode="after")
    def _bufferless_update_needs(self) -> "RunConfig":
        """``gradients.update: backward`` where the bufferless step may be chosen: the micro-batches and the descent
        check of :func:`~mtft.config.bufferless.second_backward_refusal` (processes and ZeRO stage at launch)."""
        if not self.gradients.may_update_by_second_backward():
            return self
        refusal = second_backward_refusal(self.training.gradient_accumulation_steps, self.gradients.descent_check)
        if refusal is not None:
            raise ValueError(refusal)
        return self

    @model_validator(mode="after")
    def _mixout_needs_trained_encoder(self) -> "RunConfig":
        """Mixout (Lee et al., 2020) mixes the encoder's trained weights with their pre-trained values: it needs an
        adapter method that trains them, and it changes ∂loss/∂w by the mask M/(1−p), which the per-objective
        gradients of a Gram weighting (read from each linear layer's inputs and output gradients) would miss --
        refused rather than silently wrong."""
        p = self.stability.mixout
        if p == 0.0:
            return self
        from mtft.adapters import get_method

        if self.run.stage == "pretrain":
            raise ValueError("stability.mixout applies to run.stage=finetune only")
        if not get_method(self.model.adapter.method).trains_encoder:
            raise ValueError(
                f"stability.mixout={p} needs trained encoder weights, but model.adapter.method="
                f"{self.model.adapter.method} freezes them; use model.adapter.method=full"
            )
        if self.per_objective_gradients():
            what = (
                "gradients.descent_check"
                if self.gradients.descent_check
                else f"weighting.method={self.weighting.method}"
            )
            raise ValueError(
                f"stability.mixout={p} with {what}: per-objective gradients would miss Mixout's mask M/(1−p); "
                "use weighting.method=mean"
            )
        return self

    @model_validator(mode="after")
    def _resolve_output_dir(self) -> "RunConfig":
        if "{name}" in self.run.output_dir:
            self.run.output_dir = self.run.output_dir.replace("{name}", self.run.name)
        return self
