"""The typed run configuration.

Every YAML file under ``configs/`` is validated against :class:`RunConfig`. Sections are pydantic models
with ``extra="forbid"``, so an unknown key, a wrong type or an out-of-range value is rejected before any
work starts; ``description`` is the help text that ``run.py --help`` prints for each key.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RunSection(Section):
    name: str = Field("run", min_length=1, description="Run name, used in logs and the report.")
    output_dir: str = Field(
        "runs/{name}",
        description="Directory the run writes into: resolved config, logs, checkpoints, metrics, report. "
        "'{name}' is replaced by run.name.",
    )
    seed: int = Field(0, ge=0, description="Seed for model initialisation, sampling and dropout.")
    stage: Literal["finetune"] = Field("finetune", description="What the run does.")
    resume: bool = Field(
        False, description="Continue the run in output_dir from its latest complete checkpoint."
    )
    overwrite: bool = Field(
        False, description="Replace an output_dir that holds a different run (its contents are deleted)."
    )


class TinyEncoderSection(Section):
    """Shape of the randomly initialised XLM-R-style encoder used for offline runs."""

    hidden_size: int = Field(64, ge=8, description="Hidden size of the tiny encoder.")
    num_hidden_layers: int = Field(2, ge=1, description="Number of transformer layers.")
    num_attention_heads: int = Field(4, ge=1, description="Attention heads per layer.")
    intermediate_size: int = Field(128, ge=8, description="Feed-forward inner size.")
    vocab_size: int = Field(
        2000, ge=64, description="Vocabulary size of the tokenizer trained on the run's own text."
    )

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> "TinyEncoderSection":
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be a multiple of num_attention_heads "
                f"({self.num_attention_heads})"
            )
        return self


class AdapterSection(Section):
    method: Literal["full", "head", "multi_lora", "lora"] = Field(
        "full",
        description="full: fine-tune every encoder weight; head: frozen encoder, heads only; multi_lora: "
        "Shared-A Multi-LoRA -- one frozen random A shared by all tasks, one trained B per task (SPEC §2); "
        "lora: PEFT LoRA with a separate A and B per task (mixed batches routed through PEFT's per-adapter "
        "sub-batches).",
    )
    granularity: Literal["task", "objective"] = Field(
        "task", description="multi_lora: one B per task, or one B per loss objective (weighting.objectives); "
        "with objective, every evaluated (task, language) must be a training objective.",
    )
    r: int = Field(8, ge=1, description="LoRA rank (multi_lora, lora).")
    alpha: float = Field(16.0, gt=0.0, description="LoRA alpha; the update is scaled by alpha / r.")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="LoRA dropout on the adapter's input.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["query", "value"],
        description="Layers to adapt, matched by PEFT's rules (a name suffix, e.g. query, value, dense).",
    )
    init_a: Literal["peft", "gaussian"] = Field(
        "peft", description="Initialisation of the shared A: peft (PEFT's default, trains at usual learning "
        "rates) or gaussian (i.i.d. N(0,1), the paper's Algorithm 1)."
    )


class ModelSection(Section):
    backbone: str = Field(
        "tiny",
        min_length=1,
        description="Encoder: a Hugging Face hub id (xlm-roberta-base, bert-base-multilingual-cased, ...), "
        "a local directory, or 'tiny' for a small random XLM-R-style encoder built offline.",
    )
    revision: Optional[str] = Field(None, description="Hub revision (branch, tag or commit) of the backbone.")
    trust_remote_code: bool = Field(
        False, description="Allow the backbone's own Python code from the Hub. Off unless you trust it."
    )
    dropout: Optional[float] = Field(
        None, ge=0.0, lt=1.0, description="Override the backbone's hidden and attention dropout."
    )
    classifier_dropout: float = Field(0.1, ge=0.0, lt=1.0, description="Dropout inside the task heads.")
    adapter: AdapterSection = Field(default_factory=AdapterSection, description="Fine-tuning method.")
    tiny: TinyEncoderSection = Field(default_factory=TinyEncoderSection, description="Tiny encoder shape.")


class MixingSection(Section):
    strategy: Literal["proportional", "temperature", "uniform"] = Field(
        "temperature",
        description="How objectives are mixed in training batches: proportional to their sizes, "
        "temperature-scaled (p_t ∝ n_t^(1/T)), or uniform.",
    )
    temperature: float = Field(
        2.0, ge=1.0, description="T of temperature mixing; 1 is proportional, large T tends to uniform."
    )
    cap: Optional[int] = Field(
        None, ge=1, description="Count at most this many examples per objective when computing the mix."
    )


class TaskSelection(Section):
    name: str = Field(..., min_length=1, description="Task name, e.g. 'xnli' (see tasks/README.md).")
    languages: Optional[list[str]] = Field(
        None, description="Languages to evaluate (and train, in-language); default: the task's full list."
    )
    protocol: Optional[Literal["in_language", "zero_shot"]] = Field(
        None,
        description="zero_shot: train on the task's source language only, evaluate every language; "
        "in_language: train and evaluate every language. Default: the task's own default.",
    )
    max_train_examples: Optional[int] = Field(
        None, ge=1, description="Use at most this many training examples per objective."
    )
    max_eval_examples: Optional[int] = Field(
        None, ge=1, description="Use at most this many evaluation examples per objective."
    )
    max_length: Optional[int] = Field(
        None, ge=8, le=8192,
        description="Maximum tokens per encoded row of this task (e.g. 384 for QA windows); default data.max_length.",
    )
    settings: dict[str, Any] = Field(
        default_factory=dict,
        description="Settings of the task's kind, overriding its task file (e.g. {doc_stride: 128, "
        "max_answer_length: 30} for question answering; see tasks/README.md). Checked when the task loads.",
    )

    @field_validator("languages")
    @classmethod
    def _nonempty_unique(cls, value: Optional[list[str]]) -> Optional[list[str]]:
        if value is not None:
            if not value:
                raise ValueError("must list at least one language")
            if len(set(value)) != len(value):
                raise ValueError(f"lists a language twice: {value}")
        return value


class DataSection(Section):
    tasks: list[TaskSelection] = Field(..., min_length=1, description="Tasks to train and evaluate.")
    task_dirs: list[str] = Field(
        default_factory=list,
        description="Extra folders holding task definitions, searched before the built-in tasks/ folder.",
    )
    sources: dict[str, str] = Field(
        default_factory=dict,
        description="Map a Hub dataset id to a local folder with the same layout (configs, splits, "
        "features), e.g. {facebook/xnli: data/xnli}; loaded through the same datasets.load_dataset call.",
    )
    max_length: int = Field(128, ge=8, le=8192, description="Maximum tokens per example.")
    mixing: MixingSection = Field(default_factory=MixingSection, description="Objective mixing.")
    cache_dir: Optional[str] = Field(
        None, description="Cache for tokenizers and datasets; default $MTFT_CACHE or ~/.cache/mtft."
    )


class WeightingSection(Section):
    method: str = Field(
        "mean",
        description="How the per-objective losses are combined each step (see mtft.weighting).",
    )
    objectives: Literal["task_language", "task", "language"] = Field(
        "task_language", description="What one objective is: a (task, language) pair, a task, or a language."
    )
    shared: Literal["auto", "encoder", "all"] = Field(
        "auto",
        description="Parameters whose gradients form the Gram: auto = every trainable parameter that more "
        "than one objective updates (the encoder; a task head shared by its languages); encoder = encoder "
        "parameters only; all = every trainable parameter.",
    )
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="Options of the weighting method, e.g. {solver: cvxpy} for lfmlf, {c: 0.4} for cagrad.",
    )
    stationarity_eps: Optional[float] = Field(
        None, gt=0.0,
        description="Stop training once ||d||² / mean_t ||g_t||² stays below this for stationarity_patience "
        "consecutive steps (Pareto stationarity, Theorem 3). Null: never stop for it.",
    )
    stationarity_patience: int = Field(10, ge=1, description="Consecutive stationary steps before stopping.")
    cosine_every: int = Field(
        50, ge=0, description="Log the cosine matrix of the per-objective gradients every N steps (0: never)."
    )

    @field_validator("method")
    @classmethod
    def _known_method(cls, value: str) -> str:
        from mtft.weighting import WEIGHTINGS

        if value not in WEIGHTINGS:
            raise ValueError(f"unknown weighting {value!r}; valid choices: {', '.join(sorted(WEIGHTINGS))}")
        return value

    @model_validator(mode="after")
    def _options_accepted(self) -> "WeightingSection":
        from mtft.weighting import WEIGHTINGS

        try:
            WEIGHTINGS[self.method](**self.options)
        except (TypeError, ValueError) as error:
            raise ValueError(f"options {self.options} do not fit weighting {self.method!r}: {error}") from None
        return self


class OptimizerSection(Section):
    name: Literal["adamw", "sgd"] = Field("adamw", description="Optimizer.")
    lr: float = Field(5e-5, gt=0.0, description="Peak learning rate.")
    weight_decay: float = Field(0.01, ge=0.0, description="Decoupled (AdamW) or L2 (SGD) weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    eps: float = Field(1e-8, gt=0.0, description="AdamW epsilon.")
    momentum: float = Field(0.9, ge=0.0, lt=1.0, description="SGD momentum (0 for plain SGD).")
    nesterov: bool = Field(False, description="SGD Nesterov momentum.")

    @model_validator(mode="after")
    def _nesterov_needs_momentum(self) -> "OptimizerSection":
        if self.name == "sgd" and self.nesterov and self.momentum == 0:
            raise ValueError("nesterov=true needs momentum > 0")
        return self

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in value):
            raise ValueError(f"betas must lie in [0, 1), got {list(value)}")
        return value


class SchedulerSection(Section):
    name: Literal["constant", "linear", "cosine"] = Field(
        "linear", description="Learning-rate decay after warm-up."
    )
    warmup_ratio: float = Field(0.0, ge=0.0, lt=1.0, description="Warm-up as a fraction of max_steps.")
    warmup_steps: Optional[int] = Field(None, ge=0, description="Warm-up steps (overrides warmup_ratio).")


class TrainingSection(Section):
    max_steps: int = Field(1000, ge=1, description="Optimizer steps to train for.")
    micro_batch_size: int = Field(32, ge=1, description="Examples per process per forward pass.")
    gradient_accumulation_steps: int = Field(1, ge=1, description="Micro-batches per optimizer step.")
    optimizer: OptimizerSection = Field(default_factory=OptimizerSection, description="Optimizer.")
    scheduler: SchedulerSection = Field(default_factory=SchedulerSection, description="LR schedule.")
    gradient_clipping: Optional[float] = Field(
        1.0, gt=0.0, description="Clip the global gradient norm to this value (null: no clipping)."
    )
    precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto", description="auto: bf16 on a GPU that supports it, fp32 otherwise."
    )
    deepspeed_config: str = Field(
        "configs/deepspeed/zero0.json",
        description="DeepSpeed JSON (ZeRO stage etc.); batch sizes, clipping and precision come from "
        "this file's run config and must not be repeated there.",
    )


class EvaluationSection(Section):
    every_steps: Optional[int] = Field(None, ge=1, description="Evaluate every N steps (and always at the end).")
    split: Literal["validation", "test"] = Field("validation", description="Split used for evaluation.")
    batch_size: int = Field(64, ge=1, description="Examples per evaluation batch.")
    metric_for_best: Optional[str] = Field(
        None,
        description="Metric that selects the best checkpoint: '<task>/<metric>' (the task's macro "
        "average over languages) or '<task>/<language>/<metric>'. Default: no best-checkpoint selection.",
    )
    greater_is_better: bool = Field(True, description="Whether a larger metric_for_best is better.")


class CheckpointSection(Section):
    every_steps: Optional[int] = Field(None, ge=1, description="Save a checkpoint every N steps (and at the end).")
    keep_last: int = Field(2, ge=1, description="Keep this many most recent step checkpoints.")


class LoggingSection(Section):
    every_steps: int = Field(10, ge=1, description="Log losses and throughput every N steps.")
    tensorboard: bool = Field(False, description="Also write TensorBoard scalars (needs tensorboard).")
    progress_bar: bool = Field(True, description="Show a tqdm progress bar on rank 0.")


class RunConfig(Section):
    run: RunSection = Field(default_factory=RunSection, description="Run identity and output.")
    model: ModelSection = Field(default_factory=ModelSection, description="Backbone and heads.")
    data: DataSection = Field(..., description="Tasks, data sources and mixing.")
    weighting: WeightingSection = Field(default_factory=WeightingSection, description="Loss combination.")
    training: TrainingSection = Field(default_factory=TrainingSection, description="Optimisation.")
    evaluation: EvaluationSection = Field(default_factory=EvaluationSection, description="Evaluation.")
    checkpointing: CheckpointSection = Field(default_factory=CheckpointSection, description="Checkpoints.")
    logging: LoggingSection = Field(default_factory=LoggingSection, description="Logging.")

    @model_validator(mode="after")
    def _gram_weighting_supports_adapter(self) -> "RunConfig":
        from mtft.weighting import WEIGHTINGS

        if self.model.adapter.method == "lora" and WEIGHTINGS[self.weighting.method].needs_gram:
            # PEFT applies each adapter to a sub-batch of its own rows (x[rows] -> lora_A -> lora_B), so the
            # per-objective gradient hooks, which attribute the rows of a layer's whole input, cannot see them.
            raise ValueError(
                f"weighting.method={self.weighting.method} needs per-objective gradients, which cover PEFT's "
                "multi-adapter sub-batches only through multi_lora; use model.adapter.method=multi_lora, or "
                "weighting.method=mean to compare with lora"
            )
        return self

    @model_validator(mode="after")
    def _resolve_output_dir(self) -> "RunConfig":
        if "{name}" in self.run.output_dir:
            self.run.output_dir = self.run.output_dir.replace("{name}", self.run.name)
        return self
