"""Read a run config: safe YAML, ``key.sub=value`` overrides, validation with one clear error."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any, Iterable, Iterator

import yaml
from pydantic import BaseModel, ValidationError

from mtft.config.run_config import RunConfig
from mtft.config.schema import FLAT_ADAPTER_KEYS, MOVED_TO_GRADIENTS, AdapterSection, WeightingSection
from mtft.core.errors import ConfigError, echo
from mtft.core.safe_yaml import load_yaml, read_text


def load_config(path: str | Path, overrides: Iterable[str] = ()) -> RunConfig:
    """Load ``path``, apply ``overrides`` (``a.b.c=value``, value parsed as YAML) and validate."""
    path = Path(path)
    raw = read_yaml_mapping(path)
    gradients_of_a_written_config(raw)
    parsed = [parse_override(item) for item in overrides]
    options_follow_methods(raw, parsed)
    overridden = set()
    for key, value in parsed:
        set_dotted(raw, key, value)
        overridden.add(key)
    return validate_config(raw, source=str(path), overridden=overridden)


def options_follow_methods(raw: dict[str, Any], overrides: list[tuple[str, Any]]) -> None:
    """The one rule for a config's options when overrides switch a method, wherever the overrides come from (the
    command line, a study's overrides and cell): the weighting's and the adapter's options follow their method."""
    options_follow_method(raw, overrides)
    adapter_options_follow_method(raw, dict(overrides))


def options_follow_method(raw: dict[str, Any], overrides: list[tuple[str, Any]]) -> None:
    """Drop the file's ``weighting.options`` when the overrides switch ``weighting.method`` to another method.

    Options are the keyword arguments of one weighting, so those written in the file belong to the file's method:
    ``weighting.method=mean`` on the command line of a config written for ``lfmlf`` with ``{floor: 0.3}`` trains
    with mean and no options, instead of refusing the floor. Options given on the command line are kept (and
    checked against the new method: one the new method does not take is named in the error)."""
    methods = [value for key, value in overrides if key == "weighting.method"]
    section = raw.get("weighting")
    if methods and isinstance(section, dict) and methods[-1] != section.get("method", DEFAULT_WEIGHTING):
        section.pop("options", None)


DEFAULT_WEIGHTING = WeightingSection.model_fields["method"].default
DEFAULT_ADAPTER = AdapterSection.model_fields["method"].default


def adapter_options_follow_method(raw: dict[str, Any], overrides: dict[str, Any]) -> None:
    """Drop the keys of the file's ``model.adapter`` that the run's method does not take, where the file wrote them
    for another method rather than by mistake:

    - the overrides (command line, a study's cell) switch the method: the file's options follow it, as
      ``weighting.options`` do -- those the new method takes are kept (``r`` of multi_lora is ``r`` of lora);
    - the file's method takes no options (``full``, ``head``): LoRA keys beside it are the adapter its command
      lines and studies switch to (``tests/e2e/base.yaml``, ``configs/mix.yaml``);
    - the section holds every key of the one flat section of earlier versions: a run folder's resolved config.yaml.

    Any other key of another method's is refused by the schema, naming its owner; so is, always, an override's."""
    from mtft.adapters import METHODS

    section = raw.get("model", {}).get("adapter") if isinstance(raw.get("model"), dict) else None
    if not isinstance(section, dict):
        return
    written = section.get("method", DEFAULT_ADAPTER)
    method = overrides.get("model.adapter.method", written)
    try:
        own, written_own = (set((METHODS.options_model(m) or BaseModel).model_fields) for m in (method, written))
    except (TypeError, ValueError):
        return  # an unknown method: its own error is the one reported
    if method != written or not written_own or set(section) == FLAT_ADAPTER_KEYS:
        for key in [key for key in section if key != "method" and key not in own]:
            del section[key]


def gradients_of_a_written_config(raw: dict[str, Any]) -> None:
    """Move the ``gradients`` keys of a config.yaml that an earlier mtft wrote out of its ``weighting`` section.

    A run folder's resolved config, written before the ``gradients`` section existed, holds every key of
    ``weighting`` and the six that moved beside them: it is the run it records, read as this version names its
    keys (a resume, a study's record, an evaluation of the run). Any other ``weighting`` that writes a moved key
    is left alone, for :func:`validate_config` to refuse in one line naming the new key."""
    section = raw.get("weighting")
    if "gradients" in raw or not isinstance(section, dict) or not set(WeightingSection.model_fields) <= set(section):
        return
    moved = {MOVED_TO_GRADIENTS[key]: section.pop(key) for key in list(section) if key in MOVED_TO_GRADIENTS}
    if moved:
        raw["gradients"] = moved


def moved_gradient_keys(raw: dict[str, Any], source: str, overridden: set[str] = frozenset()) -> None:
    """Refuse, in one line saying what to rename, a ``weighting`` section that writes a key of ``gradients`` (where
    earlier versions had it), before the schema would call it an unknown key."""
    section = raw.get("weighting")
    old = [key for key in MOVED_TO_GRADIENTS if key in section] if isinstance(section, dict) else []
    if not old:
        return
    from_cli = any(f"weighting.{key}" in overridden for key in old)
    where = f"{source} [command line]" if from_cli else source
    first, *others = old
    also = ", ".join(f"weighting.{key} -> gradients.{MOVED_TO_GRADIENTS[key]}" for key in others)
    raise ConfigError(
        f"{where}: weighting.{first} moved to gradients.{MOVED_TO_GRADIENTS[first]}"
        + (f" (and {also})" if also else "")
        + ": the gradients section holds how the per-objective gradients are formed"
    )


def read_yaml_mapping(path: Path) -> dict[str, Any]:
    data = load_yaml(read_text(path, "config file"), str(path))
    if data is None:
        raise ConfigError(f"{path}: the config file is empty")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config must be a mapping of sections, got {type(data).__name__}")
    return data


def parse_override(item: str) -> tuple[str, Any]:
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"bad override {item!r}: expected key.sub=value, e.g. training.max_steps=100")
    try:
        value = load_yaml(text, f"override {key!r}") if text.strip() else None
    except ConfigError:
        value = text  # an unparsable value is taken as the literal string; validation judges it
    return key, value


def set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    """Set ``tree[a][b][c] = value`` for ``key == "a.b.c"``; integer parts index into lists."""
    parts = key.split(".")
    node: Any = tree
    for i, part in enumerate(parts[:-1]):
        node = _child(node, part, key, create_next=parts[i + 1])
    last = parts[-1]
    if isinstance(node, list):
        node[_list_index(node, last, key)] = value
    else:
        node[last] = value


def _child(node: Any, part: str, key: str, create_next: str) -> Any:
    if isinstance(node, list):
        return node[_list_index(node, part, key)]
    if not isinstance(node, dict):
        raise ConfigError(f"override {key!r}: '{part}' is inside a value that is not a section")
    if node.get(part) is None:
        node[part] = [] if create_next.isdigit() else {}
    return node[part]


def _list_index(node: list, part: str, key: str) -> int:
    if not part.isdigit() or int(part) >= len(node):
        raise ConfigError(f"override {key!r}: '{part}' is not an index of a list of {len(node)} items")
    return int(part)


def validate_config(raw: dict[str, Any], source: str, overridden: set[str] = frozenset()) -> RunConfig:
    moved_gradient_keys(raw, source, overridden)
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as exc:
        problems = [_describe(err, source, overridden) for err in exc.errors()]
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise ConfigError("; ".join(problems[:3]) + more) from None


def _describe(err: dict[str, Any], source: str, overridden: set[str]) -> str:
    loc = [str(p) for p in err["loc"]]
    key = ".".join(loc) or "<top level>"
    from_cli = any(o == key or o.startswith(key + ".") for o in overridden)
    where = f"{source} [command line]" if from_cli else source
    kind = err["type"]
    if kind == "extra_forbidden":
        parent = loc[:-1]
        valid = ", ".join(section_keys(parent))
        scope = f" under '{'.'.join(parent)}'" if parent else ""
        return f"{where}: unknown key '{key}'; valid keys{scope}: {valid}"
    if kind == "missing":
        return f"{where}: required key '{key}' is missing"
    got = err.get("input")
    got_text = "" if isinstance(got, (dict, list)) else f" (got {echo(got)})"
    message = " ".join(str(err["msg"]).split())  # mtft's own words, whole: only echoed input is shortened (echo)
    if kind == "value_error":
        message = message.removeprefix("Value error, ")
    if kind in ("literal_error", "enum"):
        message = "invalid value; valid choices: " + ", ".join(
            s.strip(" '") for s in str(err.get("ctx", {}).get("expected", "")).replace(" or ", ", ").split(",")
        )
    return f"{where}: {key}: {message}{got_text}"


def section_keys(path: list[str]) -> list[str]:
    """The valid keys of the config section at ``path`` (list indexes are skipped)."""
    model: type[BaseModel] | None = RunConfig
    for part in path:
        if model is None or part.isdigit():
            continue
        field = model.model_fields.get(part)
        model = _model_of(field.annotation) if field else None
    return sorted(model.model_fields) if model else []


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_of(arg)
        if found:
            return found
    return None


def iter_options(model: type[BaseModel] = RunConfig, prefix: str = "") -> Iterator[tuple[str, str, Any, str]]:
    """(key, type, default, help) for every leaf option, for ``--help``."""
    nested = getattr(model, "nested_help", None)  # keys whose schema depends on another key
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        if field.exclude:  # typed from the keys beside it (model.adapter's options): those are listed instead
            for option, annotation, option_default, description in nested(name) if nested else []:
                yield f"{prefix}{option}", _type_name(annotation), option_default, description
            continue
        sub = _model_of(field.annotation)
        if sub is not None:
            list_of = typing.get_origin(field.annotation) is list
            yield from iter_options(sub, key + (".N." if list_of else "."))
            continue
        default = "required" if field.is_required() else field.get_default(call_default_factory=True)
        yield key, _type_name(field.annotation), default, field.description or ""
        for option, annotation, option_default, description in nested(name) if nested else []:
            yield f"{key}.{option}", _type_name(annotation), option_default, description


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return "|".join(str(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return " | ".join(_type_name(a) for a in args) + " | null"
    if origin is not None:
        return str(annotation).replace("typing.", "")
    return getattr(annotation, "__name__", str(annotation))


def config_to_yaml(config: RunConfig) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False, allow_unicode=True)
