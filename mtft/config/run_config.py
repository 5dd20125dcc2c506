"""The whole run's configuration: one field per section of :mod:`mtft.config.schema`, and the rules that read
more than one section.

Only the orchestration (``mtft.training``, ``mtft.api``, ``mtft.commands``, ``mtft.study``, the CLI) takes a
:class:`RunConfig`; everything below it is handed the sections it reads (an import-linter contract in setup.cfg).
"""

from __future__ import annotations

from pydantic import Field, model_validator

from mtft.config.schema import (
    CheckpointSection,
    CorpusSection,
    DataSection,
    EvaluationSection,
    ForgettingSection,
    LoggingSection,
    ModelSection,
    PretrainSection,
    RunSection,
    Section,
    StabilitySection,
    TrainingSection,
    WeightingSection,
)


class RunConfig(Section):
    run: RunSection = Field(
        default_factory=RunSection,
        description="Name, output folder, seed, stage (finetune or pretrain), resume and overwrite.",
    )
    model: ModelSection = Field(
        default_factory=ModelSection,
        description="Backbone (Hub id, local folder or tiny), dropout, adapter method and its options.",
    )
    data: DataSection = Field(
        ...,
        description="Tasks (languages, protocol, sources), data sources, lengths, mixing, dev split.",
    )
    weighting: WeightingSection = Field(
        default_factory=WeightingSection,
        description="How per-objective losses are combined (mean, lfmlf, ...); what an objective is.",
    )
    training: TrainingSection = Field(
        default_factory=TrainingSection,
        description="Steps, batch sizes, optimizer, scheduler, precision, the DeepSpeed JSON.",
    )
    evaluation: EvaluationSection = Field(
        default_factory=EvaluationSection, description="Evaluation split and interval, model selection, early stopping."
    )
    checkpointing: CheckpointSection = Field(
        default_factory=CheckpointSection, description="Checkpoint interval and how many are kept."
    )
    logging: LoggingSection = Field(
        default_factory=LoggingSection, description="Log interval, TensorBoard, progress bar."
    )
    corpus: CorpusSection = Field(
        default_factory=CorpusSection,
        description="Generic text of the masked-LM loss L_p (the forgetting monitors, pre-training).",
    )
    pretrain: PretrainSection = Field(
        default_factory=PretrainSection,
        description="Masked-LM pre-training, before fine-tuning (cached) or as a run of its own.",
    )
    forgetting: ForgettingSection = Field(
        default_factory=ForgettingSection,
        description="Forgetting monitors: bound vs measured forgetting, budget, probe, retrieval.",
    )
    stability: StabilitySection = Field(
        default_factory=StabilitySection, description="Stable fine-tuning methods (MMR, MHLoss, SURT, Mixout)."
    )

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
        if not method.supports_gram and self.weighting.descent_check:
            raise ValueError(
                "weighting.descent_check=true needs per-objective gradients, which model.adapter.method="
                f"{self.model.adapter.method} does not provide; set weighting.descent_check=false"
            )
        return self

    @model_validator(mode="after")
    def _bufferless_update_needs(self) -> "RunConfig":
        """``bufferless_update: backward`` forms each layer's part of the Gram at its hook, so each layer's products
        must be complete there: one micro-batch a step; and it keeps nothing to re-form them for the descent check.
        (One process is checked at launch, where the world size is known.)"""
        weighting = self.weighting
        if not weighting.may_update_by_second_backward():
            return self
        if self.training.gradient_accumulation_steps > 1:
            raise ValueError(
                "weighting.bufferless_update=backward forms the Gram during the backward pass, exact for one "
                f"micro-batch a step (training.gradient_accumulation_steps={self.training.gradient_accumulation_steps}"
                "), since the micro-batches' cross terms enter the Gram: use weighting.bufferless_update=tape"
            )
        if weighting.descent_check:
            raise ValueError(
                "weighting.descent_check=true re-forms the per-objective products after the step, from the tape that "
                "weighting.bufferless_update=backward does not keep: use weighting.bufferless_update=tape"
            )
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
        if self.weighting.per_objective_gradients():
            what = (
                "weighting.descent_check"
                if self.weighting.descent_check
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
