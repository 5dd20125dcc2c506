"""The study file: a base run config, a grid and/or named variants, the seeds, what to aggregate, how to execute.

A study is a set of *cells* (one combination of grid values, or one named variant, or both) times a set of seeds;
every (cell, seed) is an ordinary run. The file is validated like a run config (unknown keys, wrong types: one line),
and :mod:`mtft.study.plan` then validates every cell's resolved run config before anything runs.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import UnionType
from typing import Any, Iterable, Literal, Optional, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mtft.config.load import parse_override, read_yaml_mapping, set_dotted
from mtft.config.schema import check_count_or_fraction
from mtft.core.errors import ConfigError, echo, shorten
from mtft.core.paths import name_problem, name_value
from mtft.study.failure import pattern_problem


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Variant(_Section):
    name: str = Field(..., description="The variant's name: its cell folder, its row in the tables.")
    overrides: dict[str, Any] = Field(
        default_factory=dict, description="Run-config overrides of this variant, dotted keys: {weighting.method: mean}."
    )

    @field_validator("name")
    @classmethod
    def _a_file_name(cls, value: str) -> str:
        return name_value(value, "variant name")


class FewerSeeds(_Section):
    cells: dict[str, Any] = Field(
        ..., description="A partial cell, axis -> value (as an exclude entry): the cells matching every pair."
    )
    num_seeds: int = Field(..., ge=1, description="How many of the study's seeds (the first) those cells run.")


class LeaveOneOutSection(_Section):
    """Paired runs on S^i for the leave-one-out model stability (Fu, So & Collier, 2023, Def. 2.1 and 2.3)."""

    count: Optional[int] = Field(None, ge=1, description="Examples removed from each training split (1: S^i).")
    fraction: Optional[float] = Field(
        None, gt=0.0, lt=1.0, description="Fraction removed from each training split (0.1: the paper's §4.2.7)."
    )
    draws: int = Field(1, ge=1, description="Paired runs per (cell, seed): draw i removes its own examples.")
    seed: int = Field(
        0, ge=0, description="Draw i removes with data.leave_out.seed = seed + i, the same in every cell and seed."
    )

    @model_validator(mode="after")
    def _count_or_fraction(self) -> "LeaveOneOutSection":
        check_count_or_fraction(self.count, self.fraction)
        return self

    def leave_out(self, draw: int) -> dict[str, Any]:
        """The run config's ``data.leave_out`` of draw ``draw``."""
        removed = {"count": self.count} if self.count is not None else {"fraction": self.fraction}
        return {**removed, "seed": self.seed + draw}


class SlurmSection(_Section):
    """What each Slurm job asks for (passed to submitit's ``update_parameters``)."""

    partition: Optional[str] = Field(None, description="Slurm partition.")
    time_min: int = Field(60, ge=1, description="Time limit of one job (one run), minutes.")
    gpus_per_job: int = Field(0, ge=0, description="GPUs of one job; more than 1 launches the run with torchrun.")
    processes_per_node: Optional[int] = Field(
        None,
        ge=1,
        description="Processes (DeepSpeed ranks) of a job per node; default one per GPU, or 1 without GPUs.",
    )
    cpus_per_task: int = Field(4, ge=1, description="CPU cores of each process of a job (its thread count).")
    nodes: int = Field(1, ge=1, description="Nodes of one job; more than 1 is a multi-node DeepSpeed run.")
    mem_gb: Optional[int] = Field(None, ge=1, description="Memory per node, GB.")
    array_parallelism: int = Field(32, ge=1, description="At most this many jobs of the array run at once.")
    cluster: Optional[Literal["slurm", "local", "debug"]] = Field(
        None,
        description="submitit's cluster: default slurm when sbatch is on PATH; local runs the same job objects "
        "as local processes (how the tests exercise this path).",
    )
    additional: dict[str, Any] = Field(
        default_factory=dict, description="Extra #SBATCH parameters (submitit's slurm_additional_parameters)."
    )
    setup: list[str] = Field(default_factory=list, description="Shell lines run before each job (module load, ...).")

    @field_validator("partition")
    @classmethod
    def _one_line(cls, value: Optional[str]) -> Optional[str]:
        problem = None if value is None else _sbatch_value_problem(value)
        if problem:
            raise ValueError(f"{problem}, got {echo(value)}")
        return value

    @field_validator("additional")
    @classmethod
    def _one_line_each(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key, item in value.items():
            if not _SBATCH_OPTION.fullmatch(key):
                raise ValueError(
                    f"{echo(key)} is not an sbatch option name (letters, digits, '-' and '_'; it is written "
                    "unquoted as #SBATCH --<name>=<value>)"
                )
            problem = _sbatch_value_problem(str(item))
            if problem:
                raise ValueError(f"{echo(key)}: {echo(item)} {problem}")
        return value


_SBATCH_OPTION = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")


def _sbatch_value_problem(text: str) -> Optional[str]:
    """Why ``text`` cannot be one ``#SBATCH --key=value`` line's value, or None. submitit writes the value
    shell-quoted (``shlex.quote``) into a line that bash reads as a comment and sbatch splits into arguments with its
    own quote rules (Slurm, src/sbatch/opt.c, ``_get_argument``), so spaces, ``;``, ``$(...)``, ``#`` and quotes
    arrive as one literal value. Two characters do not: a line break ends the #SBATCH line and starts a shell line
    of the job script, and sbatch reads a backslash as an escape even inside quotes (it would be dropped)."""
    if len(text.splitlines()) > 1 or text.endswith(("\n", "\r")):
        return "must be one line (it becomes an #SBATCH line of the job script)"
    if "\\" in text:
        return "must not hold a backslash (sbatch reads it as an escape in an #SBATCH line and drops it)"
    return None


class ExecutorSection(_Section):
    name: Literal["local", "slurm"] = Field("local", description="local: subprocesses here; slurm: job arrays.")
    workers: int = Field(2, ge=1, description="local: runs at the same time.")
    threads: Optional[int] = Field(
        None, ge=1, description="local: threads per run; default cores // workers (workers x threads <= cores)."
    )
    slurm: SlurmSection = Field(default_factory=SlurmSection, description="The slurm executor's job resources.")


class StudySpec(_Section):
    name: str = Field(..., description="The study's name; the study directory is refused to any other study.")
    base: str = Field(..., description="The base run config, relative to the study file (or absolute).")
    overrides: dict[str, Any] = Field(
        default_factory=dict, description="Run-config overrides common to every cell, dotted keys."
    )
    grid: dict[str, list[Any]] = Field(
        default_factory=dict,
        description="Run-config key -> values; the cells are the cartesian product (times the variants).",
    )
    variants: list[Variant] = Field(
        default_factory=list, description="Named sets of overrides, for comparisons that are not a product."
    )
    factors: dict[str, dict[str, dict[str, Any]]] = Field(
        default_factory=dict,
        description="Named axes whose levels are named sets of overrides: axis -> {level: {key: value}}, e.g. "
        "setup: {full-adamw: {model.adapter.method: full, training.optimizer.lr: 1e-3}, ...}; crossed with the "
        "variants and the grid.",
    )
    exclude: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Cells left out of the product: each entry is axis -> value (a partial cell, e.g. {variant: "
        "lfmlf-adam-metric, setup: full-sgd}); a cell matching every pair of any entry is not run.",
    )
    fewer_seeds: list[FewerSeeds] = Field(
        default_factory=list,
        description="Cells that run only the first num_seeds of the seeds: comparisons around a powered core at "
        "less cost, e.g. [{cells: {variant: cagrad}, num_seeds: 3}]; a paired difference uses the seeds both cells "
        "ran. A cell matching several entries runs the fewest.",
    )
    seeds: Optional[list[int]] = Field(None, description="Fine-tuning seeds (run.seed) of every cell.")
    num_seeds: Optional[int] = Field(None, ge=1, description="Seeds 0..num_seeds-1 (instead of seeds).")
    seed_keys: list[str] = Field(
        default_factory=lambda: ["run.seed"],
        description="Run-config keys every seed sets (run.seed always among them), e.g. [run.seed, pretrain.seed]: "
        "each seed then pre-trains its own backbone too, so the spread over seeds includes the backbone's.",
    )
    metrics: list[str] = Field(
        default_factory=lambda: ["*"],
        description="Metrics to aggregate: keys of a run's metrics.json (fnmatch patterns allowed, e.g. "
        "xnli/*/accuracy) and the run summaries F_p_final, F_p_max, distance, bound_path, wall_s.",
    )
    failure: list[str] = Field(
        default_factory=list,
        description="Metrics whose failed-run rate is counted per cell (names or fnmatch patterns, e.g. "
        "superglue_rte/accuracy, 'glue_*/mcc'): a run fails when its value is at or below the majority-class baseline "
        "it reports beside (<task>/majority_<metric>; classification tasks only) (Mosbach et al., 2021).",
    )
    baseline: Optional[dict[str, Any]] = Field(
        None,
        description="The cell every other is compared with, seed by seed: axis -> value, e.g. {variant: mean} or "
        "{weighting.method: mean}; paired differences with 95% confidence intervals.",
    )
    leave_one_out: Optional[LeaveOneOutSection] = Field(
        None,
        description="Next to every run on S, `draws` runs with the same seed on S^i (count or fraction of each "
        "training split removed); the study reports E||A(S^i) − A(S)|| per cell (docs/stability.md).",
    )
    analyses: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Analyses beyond the tables, by name with their options (mtft/study/analyses.py), e.g. "
        "overtraining: {task_metrics: [xnli/accuracy]}: extra numbers per run and a section of study.md.",
    )
    output_dir: str = Field("studies/{name}", description="The study directory; '{name}' is replaced.")
    executor: ExecutorSection = Field(
        default_factory=ExecutorSection, description="How the runs are executed (not part of what the study is)."
    )

    @field_validator("name")
    @classmethod
    def _a_file_name(cls, value: str) -> str:
        return name_value(value, "study name")

    @field_validator("grid")
    @classmethod
    def _axes_with_values(cls, value: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for key, values in value.items():
            if key == "variant" or key.startswith(("run.seed", "run.output_dir", "run.name")):
                raise ValueError(f"'{key}' is set by the study itself and cannot be a grid axis")
            if not values:
                raise ValueError(f"axis '{key}' lists no values")
            if len({repr(v) for v in values}) != len(values):
                raise ValueError(f"axis '{key}' lists a value twice: {echo(values)}")
        return value

    @field_validator("seed_keys")
    @classmethod
    def _seed_keys(cls, value: list[str]) -> list[str]:
        if "run.seed" not in value:
            raise ValueError(f"must include run.seed (the fine-tuning seed each run is named by), got {echo(value)}")
        if len(set(value)) != len(value):
            raise ValueError(f"a key is listed twice: {echo(value)}")
        for key in value:
            if not key.endswith(".seed"):
                raise ValueError(f"'{key}' is not a seed: seed_keys lists run-config keys ending in '.seed'")
        return value

    @field_validator("failure")
    @classmethod
    def _task_metrics(cls, value: list[str]) -> list[str]:
        for pattern in value:
            problem = pattern_problem(pattern)
            if problem:
                raise ValueError(problem)
        if len(set(value)) != len(value):
            raise ValueError(f"a metric is listed twice: {echo(value)}")
        return value

    @field_validator("factors")
    @classmethod
    def _named_levels(cls, value: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, dict[str, Any]]]:
        for axis, levels in value.items():
            if axis == "variant" or "." in axis or name_problem(axis):
                raise ValueError(f"factor name {axis!r} must be a plain name (no dots), not 'variant'")
            if not levels:
                raise ValueError(f"factor '{axis}' has no levels")
            for level in levels:
                name_value(level, f"factor '{axis}': level name")
        return value

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, value: Optional[list[int]]) -> Optional[list[int]]:
        if value is not None and (not value or len(set(value)) != len(value) or min(value) < 0):
            raise ValueError(f"must list distinct non-negative seeds, got {echo(value)}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "StudySpec":
        if (self.seeds is None) == (self.num_seeds is None):
            raise ValueError("give exactly one of seeds: [..] and num_seeds: N")
        names = [v.name for v in self.variants]
        if len(set(names)) != len(names):
            raise ValueError(f"variants: a name is used twice: {names}")
        for key in self.seed_keys:
            if key in self.grid or key in self.overrides:
                raise ValueError(f"'{key}' is set by every seed (seed_keys); it cannot also be a grid axis or override")
        if self.baseline:
            self._check_coordinates(self.baseline, "baseline")
        for index, entry in enumerate(self.exclude):
            if not entry:
                raise ValueError(f"exclude[{index}] is empty: it would leave out every cell")
            self._check_coordinates(entry, f"exclude[{index}]")
        for index, fewer in enumerate(self.fewer_seeds):
            if not fewer.cells:
                raise ValueError(f"fewer_seeds[{index}].cells is empty; give num_seeds for the whole study instead")
            self._check_coordinates(fewer.cells, f"fewer_seeds[{index}].cells")
            if fewer.num_seeds > len(self.seed_list):
                raise ValueError(
                    f"fewer_seeds[{index}]: num_seeds={fewer.num_seeds} exceeds the study's {len(self.seed_list)} seeds"
                )
        return self

    def _check_coordinates(self, coordinates: dict[str, Any], where: str) -> None:
        """Every key an axis of the study, every value one of that axis's values (variant or level names)."""
        for key, value in coordinates.items():
            if key not in self.axes:
                raise ValueError(f"{where}: '{key}' is not an axis of the study (axes: {', '.join(self.axes)})")
            choices = (
                [v.name for v in self.variants]
                if key == "variant"
                else list(self.factors[key])
                if key in self.factors
                else self.grid[key]
            )
            if value not in choices:
                raise ValueError(f"{where}: {key}={echo(value)} is not one of {echo(choices)}")

    def excludes(self, axes: dict[str, Any]) -> bool:
        """Whether the cell with these axis values is left out by an ``exclude`` entry."""
        return any(all(axes.get(key) == value for key, value in entry.items()) for entry in self.exclude)

    @property
    def axes(self) -> list[str]:
        """The study's axes in order: ``variant`` (when there are variants), the factors, then the grid keys."""
        return (["variant"] if self.variants else []) + list(self.factors) + list(self.grid)

    @property
    def seed_list(self) -> list[int]:
        return list(self.seeds) if self.seeds is not None else list(range(self.num_seeds or 0))

    def seeds_of(self, axes: dict[str, Any]) -> list[int]:
        """The seeds the cell with these axis values runs: the study's, or the first ``num_seeds`` of them where a
        ``fewer_seeds`` entry matches (the fewest of those that do)."""
        counts = [f.num_seeds for f in self.fewer_seeds if all(axes.get(k) == v for k, v in f.cells.items())]
        return self.seed_list[: min(counts)] if counts else self.seed_list

    @property
    def directory(self) -> Path:
        return Path(self.output_dir.replace("{name}", self.name))


def load_study(path: str | Path, overrides: Iterable[str] = ()) -> tuple[StudySpec, Path]:
    """The study file ``path`` with ``key=value`` overrides applied (``num_seeds=2``, ``executor.workers=1``,
    ``overrides.training.max_steps=50`` for a run-config key); returns the spec and the base config's path."""
    path = Path(path)
    raw = read_yaml_mapping(path)
    for item in overrides:
        key, value = parse_override(item)
        head, _, rest = key.partition(".")
        if head == "overrides" and rest:  # `overrides` is keyed by whole dotted run-config keys
            if not isinstance(raw.setdefault("overrides", {}), dict):
                raise ConfigError(f"{path}: overrides must be a mapping of run-config keys to values")
            raw["overrides"][rest] = value
        else:
            set_dotted(raw, key, value)
    spec = _validate(raw, path)
    base = Path(spec.base)
    base = base if base.is_absolute() else path.parent / base
    if not base.is_file():
        raise ConfigError(f"{path}: base: config file {base} not found")
    return spec, base


def _validate(raw: dict[str, Any], path: Path) -> StudySpec:
    try:
        return StudySpec.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = [str(p) for p in err["loc"]]
        key = ".".join(loc) or "<top level>"
        if err["type"] == "extra_forbidden":
            valid = ", ".join(_section(loc[:-1]).model_fields)
            raise ConfigError(f"{path}: unknown key '{key}'; valid keys: {valid}") from None
        if err["type"] == "missing":
            raise ConfigError(f"{path}: required key '{key}' is missing") from None
        got = err.get("input")
        got_text = "" if isinstance(got, (dict, list)) or err["type"] == "value_error" else f" (got {echo(got)})"
        message = shorten(err["msg"]).removeprefix("Value error, ")
        where = f"{path}: {key}" if loc else str(path)
        raise ConfigError(f"{where}: {message}{got_text}") from None


def _section(parent: list[str]) -> type[BaseModel]:
    """The model of the section at ``parent`` (``["executor", "slurm"]`` -> SlurmSection)."""
    model: type[BaseModel] = StudySpec
    for part in parent:
        annotation = model.model_fields[part].annotation if part in model.model_fields else None
        if get_origin(annotation) in (Union, UnionType):  # Optional[Section]: the section
            annotation = next((a for a in get_args(annotation) if a is not type(None)), annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model = annotation
        elif part.isdigit() or annotation is not None:
            model = Variant if part.isdigit() else model
    return model
