"""One registry's rules over every plug-in kind (as PEFT's contract tests run one table over every tuner): a name
taken by another class is refused, a ``module:Class`` entry is imported only when asked for, the base class is
checked, and an unknown name's error lists the valid names."""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest

from mtft.adapters import METHODS
from mtft.core.registry import Registry, plugin_code
from mtft.study.analyses import REGISTRY as ANALYSES
from mtft.tasks.kinds import HEAD_CLASSES, TASK_CLASSES, register_kind
from mtft.weighting import WEIGHTINGS

# kind -> (its registry, the module and class of its base)
KINDS = {
    "adapter method": (METHODS, "mtft.adapters.base", "AdapterMethod"),
    "weighting": (WEIGHTINGS, "mtft.weighting.base", "Weighting"),
    "analysis": (ANALYSES, "mtft.study.analysis", "StudyAnalysis"),
    "head kind (task)": (TASK_CLASSES, "mtft.tasks.base", "Task"),
    "head kind (head)": (HEAD_CLASSES, "mtft.models.heads", "Head"),
}
PLUGIN = """
from {module} import {base}


class Plugin({base}):
    name = "plugin_{n}"

    def weigh(self, losses, gram):  # a weighting must implement it; harmless elsewhere
        return losses


class Other({base}):
    name = "plugin_{n}"

    def weigh(self, losses, gram):
        return losses


class NotPlugin:
    pass
"""


@pytest.fixture(params=sorted(KINDS))
def kind(request, tmp_path, monkeypatch):
    """(registry, the plug-in module's name): the registry restored afterwards, the module importable, not imported."""
    registry, module, base = KINDS[request.param]
    n = sorted(KINDS).index(request.param)
    name = f"mtft_test_plugins_{n}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(PLUGIN.format(module=module, base=base, n=n)))
    monkeypatch.syspath_prepend(str(tmp_path))
    saved = registry.snapshot()
    yield registry, name
    registry.restore(saved)
    sys.modules.pop(name, None)


def test_every_plug_in_kind_has_a_registry():
    assert all(isinstance(registry, Registry) for registry, _, _ in KINDS.values())


def test_plugin_code_named_by_a_folder_mtft_reads_is_not_imported_unless_trusted(kind):
    """Within plugin_code(trusted=False, ...) -- how every reader of a run folder loads it -- neither a registered
    lazy entry nor a module:Class path imports a plug-in module; mtft's own modules still load; trusted, it does."""
    registry, module = kind
    registry.add("lazy_plugin", f"{module}:Plugin")
    with plugin_code(False, "runs/x/config.yaml"):
        for name in ("lazy_plugin", f"{module}:Plugin"):
            if name == "lazy_plugin" or registry.by_path:
                with pytest.raises(ValueError, match=rf"runs/x/config.yaml names plug-in code \({module}\), "):
                    registry.get(name)
        assert module not in sys.modules
        assert all(registry.get(builtin) for builtin in registry.names() if builtin != "lazy_plugin")
    with plugin_code(True, "runs/x/config.yaml"):
        assert registry.get("lazy_plugin").__name__ == "Plugin"


def test_a_module_class_entry_is_imported_only_when_asked_for(kind):
    registry, module = kind
    registry.add("lazy_plugin", f"{module}:Plugin")
    assert "lazy_plugin" in registry and module not in sys.modules
    cls = registry.get("lazy_plugin")
    assert cls.__name__ == "Plugin" and cls.__module__ == module and registry.get("lazy_plugin") is cls


def test_a_name_taken_by_another_class_is_refused_and_the_same_class_again_is_not(kind):
    registry, module = kind
    registry.add("clash", f"{module}:Plugin")
    registry.add("clash", f"{module}:Plugin")  # the same class again (e.g. its module re-imported): a no-op
    registry.register(registry.get("clash"))  # by its `name` attribute, as a decorator does
    with pytest.raises(ValueError, match=rf"name 'clash' is taken by {module}\.Plugin$"):
        registry.add("clash", f"{module}:Other")
    assert registry.get("clash").__name__ == "Plugin"
    existing = next(name for name in registry.names() if name != "clash")
    with pytest.raises(ValueError, match="is taken by"):
        registry.add(existing, f"{module}:Other")


def test_the_same_plug_in_file_imported_under_another_name_is_the_same_class(kind, tmp_path):
    """A run keeps a copy of its plug-in code: training it and then loading it in one Python imports the same file
    twice, under two module names. The copy's class takes the name; a copy whose code differs is still refused."""
    registry, module = kind
    registry.add("copied", importlib.import_module(module).Plugin)  # as a plug-in's register call does
    source = (tmp_path / f"{module}.py").read_text()
    for copy, text, accepted in ((f"{module}_copy", source, True), (f"{module}_changed", source + "\n# x\n", False)):
        (tmp_path / f"{copy}.py").write_text(text)
        try:
            plugin = importlib.import_module(copy).Plugin
            if accepted:
                registry.add("copied", plugin)
            else:
                with pytest.raises(ValueError, match=rf"name 'copied' is taken by {module}\.Plugin$"):
                    registry.add("copied", plugin)
        finally:
            sys.modules.pop(copy, None)
    assert registry.get("copied").__module__ == module  # the first stays: the copy is the same code


def test_the_base_class_is_checked_for_every_entry(kind):
    registry, module = kind
    base = registry.base.__name__
    registry.add("not_a_plugin", f"{module}:NotPlugin")  # lazy: checked when loaded
    with pytest.raises(ValueError, match=rf"'not_a_plugin': {module}\.NotPlugin is not a subclass of .*\.{base}$"):
        registry.get("not_a_plugin")
    with pytest.raises(ValueError, match=rf"is not a subclass of .*\.{base}$"):
        registry.add("eager", dict)
    with pytest.raises(ValueError, match="is not a subclass"):
        registry.register(dict)  # type: ignore[arg-type]
    if registry.by_path:
        with pytest.raises(ValueError, match=rf"{module}\.NotPlugin is not a subclass"):
            registry.get(f"{module}:NotPlugin")
        assert registry.get(f"{module}:Plugin").__name__ == "Plugin"  # nothing to register


def test_an_unknown_name_is_one_line_listing_the_valid_names(kind):
    registry, module = kind
    registry.add("known_one", f"{module}:Plugin")
    with pytest.raises(ValueError) as error:
        registry.get("nonesuch")
    message = str(error.value)
    assert message.startswith(f"unknown {registry.kind} 'nonesuch'; valid choices: ") and "\n" not in message
    assert all(name in message for name in registry.names()) and "known_one" in message


@pytest.mark.parametrize("name", ["", "a:b"])
def test_a_name_is_non_empty_without_a_colon(kind, name):
    registry, module = kind
    with pytest.raises(ValueError, match="needs a name without ':'"):
        registry.add(name, f"{module}:Plugin")


def test_a_head_kind_registers_both_halves_or_neither():
    saved = TASK_CLASSES.snapshot(), HEAD_CLASSES.snapshot()
    try:
        with pytest.raises(ValueError, match="name 'regression' is taken by mtft.models.regression_head"):
            register_kind("regression", "mtft.tasks.regression:RegressionTask", "mtft.models.heads:Head")
        HEAD_CLASSES.add("half", "mtft.models.heads:Head")  # the head half taken, the task half free
        with pytest.raises(ValueError, match="name 'half' is taken by mtft.models.heads.Head"):
            register_kind("half", "mtft.tasks.base:Task", "mtft.models.heads:SequenceClassificationHead")
        assert "half" not in TASK_CLASSES  # rolled back
        register_kind("my_kind", "mtft.tasks.base:Task", "mtft.models.heads:SequenceClassificationHead")
        assert TASK_CLASSES.get("my_kind").__name__ == "Task" and "my_kind" in HEAD_CLASSES
        with pytest.raises(ValueError, match="is taken"):
            register_kind("my_kind", "mtft.tasks.base:Task", "mtft.models.heads:Head")
        assert HEAD_CLASSES.get("my_kind").__name__ == "SequenceClassificationHead"
    finally:
        TASK_CLASSES.restore(saved[0])
        HEAD_CLASSES.restore(saved[1])


# -- one enrolment: a loader with its Options -------------------------------------------------------------------
def test_a_loader_is_imported_only_when_asked_for_and_its_options_are_known_before(kind):
    import importlib

    from pydantic import BaseModel

    registry, module = kind
    calls = []

    class Options(BaseModel):
        size: int = 1

    @registry.lazy("loaded_later", options=Options, about="a plug-in loaded later")
    def _load():
        calls.append(1)
        return type("Later", (importlib.import_module(module).Plugin,), {"Options": Options})

    assert registry.about("loaded_later") == "a plug-in loaded later"
    assert registry.options_model("loaded_later") is Options and not calls  # no import to know the options
    assert registry.get("loaded_later").Options is Options and calls == [1]
    assert registry.get("loaded_later") is registry.get("loaded_later") and calls == [1]  # loaded once


def test_a_loader_whose_class_has_other_options_than_enrolled_is_refused(kind):
    import importlib

    from pydantic import BaseModel

    registry, module = kind
    registry.lazy("mismatch", options=BaseModel)(
        lambda: type("Bad", (importlib.import_module(module).Plugin,), {"Options": None})
    )
    with pytest.raises(ValueError, match=r"'mismatch': .*Bad.Options is not pydantic.main.BaseModel, as enrolled$"):
        registry.get("mismatch")


@pytest.mark.parametrize("registry", [METHODS, WEIGHTINGS, ANALYSES], ids=lambda r: r.kind)
def test_a_foreign_option_names_the_registered_classes_that_take_it(registry):
    """Registry.typed_options, the one rule of every kind with options: one line, the owners, the valid options."""
    fields = {name: set((registry.options_model(name) or object).__dict__.get("model_fields", {})) for name in registry}
    for name in registry:
        for other in registry:
            for option in sorted(fields[other] - fields[name])[:1]:
                with pytest.raises(ValueError) as error:
                    registry.typed_options(name, {option: None})
                message = str(error.value)
                assert message.startswith(f"{option!r} is not an option of {registry.kind} {name!r} (an option of ")
                assert other in message.split("(an option of ")[1] and "; valid options: " in message
