"""The options contract every registered adapter method keeps (table-driven, as PEFT tests its tuners): its typed
``Options`` are the ones enrolled, listed by ``--help`` with the method, every other method's option is refused in
one line naming its owner, and a resolved config loads back as it was. A method added to the registry is tested by
adding nothing here."""

from __future__ import annotations

import sys

import pytest

from mtft.adapters import METHODS, AdapterOptions
from mtft.config import config_to_yaml, iter_options, load_config
from mtft.core.errors import ConfigError
from tests.helpers.launch import REPO

# one value per option of a built-in method that is not its default, so that a foreign option is not a no-op
VALUES = {"granularity": "objective", "init_a": "gaussian", "r": 4, "alpha": 2.0, "dropout": 0.1}
DEMO = "configs/demo.yaml"  # a Multi-LoRA file with r and target_modules beside the method


def own(method: str) -> set[str]:
    return set(METHODS.options_model(method).model_fields)


FOREIGN = [
    (method, option, owner)
    for method in METHODS.names()
    for owner in METHODS.names()
    for option in sorted(own(owner) - own(method))
]


def test_every_method_has_the_options_it_was_enrolled_with():
    for name, cls in METHODS.items():
        assert issubclass(cls.Options, AdapterOptions) and cls.Options is METHODS.options_model(name)


@pytest.mark.parametrize("method, option, owner", FOREIGN)
def test_a_foreign_option_is_refused_in_one_line_naming_its_owner(method, option, owner):
    value = VALUES.get(option, ["query"])
    with pytest.raises(ConfigError) as error:
        load_config(DEMO, [f"model.adapter.method={method}", f"model.adapter.{option}={value}"])
    message = str(error.value)
    assert "\n" not in message and f"{DEMO} [command line]: model.adapter: " in message
    assert f"'{option}' is not an option of adapter method '{method}' (an option of " in message
    owners = message.split("(an option of ")[1].split(")")[0].split(", ")
    assert owner in owners and method not in owners


def test_the_issues_command_line_is_refused():
    """lora takes neither granularity nor init_a: the first is named, with its owner."""
    with pytest.raises(ConfigError, match=r"'granularity' is not an option of adapter method 'lora' \(an option of "):
        load_config(
            DEMO,
            [
                "weighting.method=mean",
                "model.adapter.method=lora",
                "model.adapter.granularity=objective",
                "model.adapter.init_a=gaussian",
            ],
        )


@pytest.mark.parametrize("method", METHODS.names())
def test_help_lists_every_option_with_its_method(method):
    listed = {key: description for key, _, _, description in iter_options()}
    for option in own(method):
        assert f"({method})" in listed[f"model.adapter.{option}"] or any(
            key == f"model.adapter.{option}" and f"({method})" in description
            for key, _, _, description in iter_options()
        )


@pytest.mark.parametrize("method", METHODS.names())
def test_a_resolved_config_loads_back_as_it_was(tmp_path, method):
    config = load_config(DEMO, [f"model.adapter.method={method}", "weighting.method=mean"])
    assert set(config.model.adapter.model_dump()) == {"method"} | own(method)
    (tmp_path / "config.yaml").write_text(config_to_yaml(config))
    assert load_config(tmp_path / "config.yaml") == config


@pytest.mark.parametrize("method", METHODS.names())
def test_a_run_folders_config_of_one_flat_section_still_loads(tmp_path, method):
    """Before each method owned its options, a resolved config.yaml wrote every key: the foreign ones are dropped."""
    flat = (
        "data:\n  tasks:\n    - name: xnli\nmodel:\n  adapter:\n    method: {m}\n    granularity: task\n    r: 16\n"
        "    alpha: 16.0\n    dropout: 0.0\n    target_modules: [query, value]\n    init_a: peft\n"
    )
    (tmp_path / "config.yaml").write_text(flat.format(m=method))
    assert set(load_config(tmp_path / "config.yaml").model.adapter.model_dump()) == {"method"} | own(method)


def test_a_files_options_follow_a_switch_of_method_and_stay_otherwise_its_own(tmp_path):
    switched = load_config(DEMO, ["model.adapter.method=lora", "weighting.method=mean"]).model.adapter.options
    assert switched.r == 16 and switched.target_modules == ["query", "key", "value", "dense"]  # the file's, kept
    assert load_config(DEMO, ["model.adapter.method=full"]).model.adapter.model_dump() == {"method": "full"}
    base = load_config("tests/e2e/base.yaml", ["model.adapter.method=multi_lora"]).model.adapter.options
    assert base.r == 16  # LoRA keys beside method: full are the adapter a switch uses
    path = tmp_path / "c.yaml"
    path.write_text("data:\n  tasks:\n    - name: xnli\nmodel:\n  adapter: {method: lora, init_a: gaussian}\n")
    with pytest.raises(ConfigError, match=r"c.yaml: model.adapter: 'init_a' is not an option of adapter method 'lora'"):
        load_config(path)


def test_validating_a_lora_config_imports_neither_peft_nor_transformers():
    """The LoRA methods import PEFT where a model is adapted: validating their configs (--print-config, --plan, a
    study's plan) reads the methods' class attributes only, without PEFT's and transformers' seconds of imports."""
    import subprocess

    code = (
        "import sys; from mtft.config import load_config; load_config('configs/demo.yaml'); "
        "load_config('configs/demo.yaml', ['model.adapter.method=lora', 'weighting.method=mean']); "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'peft', 'transformers'}), "
        "'mtft.adapters.lora.method' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO).stdout
    assert out.split() == ["[]", "True"]  # the method was asked (and imported), PEFT was not


def test_validating_a_config_imports_no_adapter_implementation():
    """The options are enrolled with the methods: --help and a config's validation import only the chosen method."""
    import subprocess

    code = (
        "import sys; from mtft.config import load_config, iter_options; list(iter_options()); "
        "load_config('configs/mix.yaml'); print([m for m in sys.modules if m.startswith('mtft.adapters.')])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "lora" not in out and "head" not in out and "mtft.adapters.full" in out
