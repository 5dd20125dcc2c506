"""One registry for every plug-in kind: adapter methods, weightings, study analyses, head kinds, task classes.

A :class:`Registry` maps names to classes of one base class. Its rules are the same for every kind, as PEFT keeps
one mapping of tuner classes and torchtune one ``_component_`` loader:

- one enrolment for every kind, in the kind's registry module: a name, the class or -- where importing it costs --
  a *loader* (:meth:`Registry.lazy`: a function whose own ``import`` statement brings the class when it is first
  asked for, so that a run imports only the plug-ins it uses and import-linter still sees the import), and its
  typed options (``Options``, a pydantic model; known without importing a lazy class when enrolled with it);
- outside code adds its own with :meth:`Registry.register` (a class decorator) or :meth:`Registry.add` (a class or a
  ``"module:Class"`` reference, imported when first asked for);
- a name taken by another class is refused (registering the same class again, e.g. on re-importing its module, is
  a no-op, and so is the same class of the same plug-in file imported from another copy of it: a run's saved
  plug-in code, read after training it in the same Python); a name is a non-empty string without ``:``;
- every class, registered or loaded, is checked to be a subclass of the registry's base;
- where the kind allows it, a ``module:Class`` that is not registered is imported on demand (nothing to register);
- every failure is one ValueError line, and an unknown name's lists the valid names; an option that the chosen
  class does not take names the classes that do (:meth:`Registry.options`).

The base may itself be a lazy ``"module:Class"``, so that a registry in a low layer names a base class without
importing it before it is needed.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import sys
from pathlib import Path
from typing import Any, Callable, Generic, Iterator, Mapping, Optional, TypeVar, Union

from pydantic import BaseModel, ValidationError

from mtft.core.errors import echo, shorten

T = TypeVar("T")


class Lazy:
    """A class enrolled by its loader: ``load()`` imports it (an ``import`` statement inside the loader, which
    import-linter reads as any other); ``options`` is its ``Options`` model and ``about`` a line saying what it
    does, where they are to be known without importing it."""

    def __init__(self, load: Callable[[], type], options: Optional[type[BaseModel]] = None, about: str = ""):
        self.load, self.options, self.about = load, options, about


Entry = Union[type, str, Lazy]


def qualified(entry: Entry) -> str:
    """``module.Class`` of a class or of a lazy ``module:Class`` reference (the same for both); a loader's class is
    imported to name it."""
    if isinstance(entry, Lazy):
        entry = entry.load()
    return entry.replace(":", ".") if isinstance(entry, str) else f"{entry.__module__}.{entry.__qualname__}"


def same_code(taken: Entry, entry: Entry) -> bool:
    """Whether two classes are one class of one plug-in file imported twice under two module names: the same name
    in modules whose files hold the same bytes. A plug-in beside a task file is imported under a name made from its
    folder (mtft.tasks.declarative), and a run keeps a copy of it in a folder of its own, so training a run and then
    loading it in one Python (a notebook, a script) imports the same code twice; other code under the name is
    still refused."""
    if not (isinstance(taken, type) and isinstance(entry, type)) or taken.__qualname__ != entry.__qualname__:
        return False
    files = [getattr(sys.modules.get(cls.__module__), "__file__", None) for cls in (taken, entry)]
    if None in files:
        return False
    try:
        first, second = (Path(file).read_bytes() for file in files)
    except OSError:
        return False
    return first == second


#: why plug-in code may not be imported now (None: it may): set while mtft reads a folder it did not write
_UNTRUSTED: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar("untrusted_plugin_code", default=None)


@contextlib.contextmanager
def plugin_code(trusted: bool, source: str) -> Iterator[None]:
    """Within the block, unless ``trusted``, no plug-in module is imported (mtft's own and those already imported
    excepted): a run folder's ``config.yaml`` that names ``model.adapter.method: evil:Method``, a weighting by path
    or a task folder whose task file has ``class:`` would otherwise run Python code that came with data.
    ``source`` names what named the code, for the refusal."""
    token = _UNTRUSTED.set(None if trusted else source)
    try:
        yield
    finally:
        _UNTRUSTED.reset(token)


def check_plugin_import(module_name: str) -> None:
    """A ValueError line where importing ``module_name`` now would run plug-in code named by an untrusted source."""
    source = _UNTRUSTED.get()
    if source is None or module_name.split(".")[0] == "mtft" or module_name in sys.modules:
        return
    raise ValueError(
        f"{source} names plug-in code ({module_name}), which mtft does not import from a folder it reads; "
        "pass --trust-plugins (trust_plugins=True) if you trust it"
    )


def import_reference(reference: str) -> Any:
    """The attribute ``reference`` (``package.module:Class``, or ``module:Outer.Inner``) names; one ValueError line
    for a malformed reference, a module that cannot be imported (missing, missing one of its own imports, or failing
    on import) or a missing attribute."""
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise ValueError("expected module:Class, e.g. mypackage.mymodule:MyClass")
    check_plugin_import(module_name)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name is None or not (module_name == error.name or module_name.startswith(error.name + ".")):
            raise ValueError(f"importing {module_name!r} needs {error.name!r}, which is not installed") from None
        raise ValueError(f"cannot import {module_name!r} ({error})") from None
    except Exception as error:  # the plug-in's own bug, on one line
        raise ValueError(
            f"cannot import {module_name!r}: {type(error).__name__}: {' '.join(str(error).split())[:200]}"
        ) from None
    found: Any = module
    for part in attribute.split("."):
        found = getattr(found, part, None)
    if found is None:
        raise ValueError(f"module {module_name!r} has no attribute {attribute!r}")
    return found


class Registry(Generic[T]):
    """Named classes of one plug-in ``kind`` (a word for messages: "weighting", "adapter method"), all subclasses of
    ``base``. ``by_path``: a ``module:Class`` not registered is loaded on demand. ``check``: a further test of a
    class (returns why it is refused, or None)."""

    def __init__(
        self,
        kind: str,
        base: Union[type[T], str],
        entries: Optional[Mapping[str, Entry]] = None,
        by_path: bool = True,
        check: Optional[Callable[[type[T]], Optional[str]]] = None,
    ):
        self.kind, self._base, self.by_path, self._check = kind, base, by_path, check
        self._entries: dict[str, Entry] = {}
        for name, entry in (entries or {}).items():
            self.add(name, entry)

    # -- registering --------------------------------------------------------------------------------------
    def add(self, name: str, entry: Entry) -> None:
        """Register ``entry`` (a class, a :class:`Lazy` loader or ``module:Class``) as ``name``; ValueError on a
        name taken by another."""
        if not isinstance(name, str) or not name or ":" in name:
            raise ValueError(f"{self.kind} {qualified(entry)}: needs a name without ':', got {name!r}")
        if isinstance(entry, type):
            try:
                entry = self.checked(entry)
            except ValueError as error:
                raise ValueError(f"{self.kind} {name!r}: {error}") from None
        taken = self._entries.get(name)
        if taken is not None and qualified(taken) != qualified(entry) and not same_code(taken, entry):
            raise ValueError(f"{self.kind} name {name!r} is taken by {qualified(taken)}")
        if taken is None or not isinstance(taken, type):
            self._entries[name] = entry

    def lazy(
        self, name: str, options: Optional[type[BaseModel]] = None, about: str = ""
    ) -> Callable[[Callable[[], type]], Lazy]:
        """Decorator of a loader: enrol, as ``name``, the class it imports and returns when first asked for, with
        its ``Options`` model ``options`` (checked against the class on loading) and a line ``about`` it, both
        known without the import."""

        def enrol(load: Callable[[], type]) -> Lazy:
            entry = Lazy(load, options, about)
            self.add(name, entry)
            return entry

        return enrol

    def register(self, cls: type[T]) -> type[T]:
        """Class decorator: register ``cls`` under its class attribute ``name``."""
        if not (isinstance(cls, type) and issubclass(cls, self.base)):
            raise ValueError(f"{self.kind}: {cls!r} is not a subclass of {qualified(self.base)}")
        name = getattr(cls, "name", "")
        if not isinstance(name, str) or not name or ":" in name:
            raise ValueError(f"{self.kind} {qualified(cls)} needs a class attribute `name` without ':'")
        self.add(name, cls)
        return cls

    # -- looking up ---------------------------------------------------------------------------------------
    def get(self, name: str) -> type[T]:
        """The class ``name`` selects: a registered name, or (``by_path``) ``module:Class``; one ValueError line."""
        entry = self._entries.get(name)
        if entry is None and not (self.by_path and ":" in name):
            raise ValueError(f"unknown {self.kind} {name!r}; {self.valid()}")
        try:
            cls = self._load(entry if entry is not None else name)
        except ValueError as error:
            raise ValueError(f"{self.kind} {name!r}: {error}") from None
        if entry is not None:
            self._entries[name] = cls  # loaded once
        return cls

    def valid(self) -> str:
        """The valid choices, as an error message ends."""
        names = ", ".join(sorted(self._entries)) or "none registered"
        path = f"; or module:Class, a {qualified(self.base)} subclass in an importable module" if self.by_path else ""
        return f"valid choices: {names}{path}"

    def names(self) -> list[str]:
        return sorted(self._entries)

    def loaded(self) -> dict[str, type[T]]:
        """Every registered class (imports the lazy ones)."""
        return {name: self.get(name) for name in self.names()}

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, name: str) -> type[T]:
        if name not in self._entries:
            raise KeyError(name)
        return self.get(name)

    def items(self) -> list[tuple[str, type[T]]]:
        return list(self.loaded().items())

    def snapshot(self) -> dict[str, Entry]:
        """The entries as they are (for tests that register and then restore)."""
        return dict(self._entries)

    def restore(self, entries: Mapping[str, Entry]) -> None:
        self._entries = dict(entries)

    # -- typed options ------------------------------------------------------------------------------------
    def options_model(self, name: str) -> Optional[type[BaseModel]]:
        """The ``Options`` model of ``name`` (None: the class has none), without importing a loader enrolled with
        it."""
        entry = self._entries.get(name)
        if isinstance(entry, Lazy) and entry.options is not None:
            return entry.options
        return getattr(self.get(name), "Options", None)

    def about(self, name: str) -> str:
        """The line enrolled with ``name``, else the first line of its class's docstring (imports it)."""
        entry = self._entries.get(name)
        if isinstance(entry, Lazy) and entry.about:
            return entry.about
        return (self.get(name).__doc__ or "").strip().split("\n")[0]

    def option_fields(self) -> list[tuple[str, str, Any]]:
        """(option, name, pydantic FieldInfo) of every registered class's options, for ``--help``."""
        return [
            (option, name, field)
            for name in self.names()
            for option, field in (self._quiet_options(name) or BaseModel).model_fields.items()
        ]

    def typed_options(self, name: str, given: Mapping[str, Any]) -> BaseModel:
        """``given`` validated by the ``Options`` of ``name`` (which must have one). One ValueError line naming the
        bad option: a foreign one with the classes that take it and the valid ones, an ill-typed one with why."""
        model = self.options_model(name)
        if model is None:
            raise ValueError(f"{self.kind} {name!r} declares no Options")
        try:
            return model.model_validate(dict(given))
        except ValidationError as exc:
            error = exc.errors()[0]
        key = ".".join(str(part) for part in error["loc"])
        if error["type"] == "extra_forbidden":
            owners = [other for other in self.names() if key in (self._quiet_options(other) or BaseModel).model_fields]
            of = f" (an option of {', '.join(owners)})" if owners else ""
            valid = f"valid options: {', '.join(model.model_fields) or 'none'}"
            raise ValueError(f"{key!r} is not an option of {self.kind} {name!r}{of}; {valid}")
        message = shorten(error["msg"]).removeprefix("Value error, ")
        raise ValueError(f"{self.kind} {name!r}, option {key!r}: {message} (got {echo(error['input'])})")

    def _quiet_options(self, name: str) -> Optional[type[BaseModel]]:
        try:  # a plug-in that cannot be loaded now (refused, broken) owns no option
            return self.options_model(name)
        except ValueError:
            return None

    # -- the rules ----------------------------------------------------------------------------------------
    @property
    def base(self) -> type:
        if isinstance(self._base, str):
            self._base = import_reference(self._base)
        return self._base

    def _load(self, entry: Entry) -> type[T]:
        if isinstance(entry, Lazy):
            cls = self.checked(entry.load())
            if entry.options is not None and getattr(cls, "Options", None) is not entry.options:
                raise ValueError(f"{qualified(cls)}.Options is not {qualified(entry.options)}, as enrolled")
            return cls
        if not isinstance(entry, str):
            return entry
        return self.checked(import_reference(entry))

    def checked(self, found: Any) -> type[T]:
        """``found`` if it is a class this registry accepts; one ValueError line saying why not otherwise."""
        if not (isinstance(found, type) and issubclass(found, self.base)):
            what = qualified(found) if isinstance(found, type) else repr(found)
            raise ValueError(f"{what} is not a subclass of {qualified(self.base)}")
        why = self._check(found) if self._check is not None else None
        if why is not None:
            raise ValueError(f"{qualified(found)} {why}")
        return found
