"""Load one split of one dataset, from the Hub or from local files, through ``datasets.load_dataset``.

``data.sources`` in the run config maps a Hub id to a local copy:

- a folder in the Hub layout (a README.md whose YAML header lists ``configs`` and ``dataset_info``, as the
  fixtures under ``tasks/*/fixtures`` are): loaded as ``load_dataset(folder, name, split=...)``, exactly the
  call used for the Hub id, so features (ClassLabel names) and configs behave identically;
- a file pattern with ``{name}`` and ``{split}`` placeholders (``.json``/``.jsonl``/``.csv``/``.parquet``):
  loaded with the matching packaged builder.

Local files are checked before ``datasets`` sees them (:func:`check_local_files`): there, present, not empty, and
UTF-8 -- Arrow's JSON reader takes invalid bytes without a word, so the file's name and the byte would otherwise
be lost.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import logging
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

import datasets

from mtft.core.errors import DataError
from mtft.core.templates import fill_template
from mtft.core.utf8 import utf8_error
from mtft.tasks.base import DatasetRef

_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
_TEXT_FORMATS = {".json", ".jsonl", ".csv", ".tsv", ".txt"}
# files this process found valid, by (device, inode, size, modification time): a run's preflight and its loading
# read each file once, not once per split of a folder
_VALID: set[tuple[int, int, int, int]] = set()


def resolve_source(ref: DatasetRef, sources: Mapping[str, str]) -> DatasetRef:
    """Apply a ``data.sources`` mapping to ``ref`` (relative paths are taken from the working directory)."""
    local = sources.get(ref.path)
    if local is None:
        return ref
    target = Path(local)
    if target.is_dir():
        return DatasetRef(path=str(target), name=ref.name, split=ref.split, language=ref.language)
    builder = _BUILDERS.get("".join(target.suffixes[-1:]))
    if builder is None:
        raise DataError(
            f"data.sources[{ref.path!r}] = {local!r}: not a folder, and not a .json/.jsonl/.csv/.parquet pattern"
        )
    fields = {"name": ref.name or "default", "split": ref.split}
    files = fill_template(str(target), fields, f"data.sources[{ref.path!r}]")
    return DatasetRef(path=builder, split="train", data_files=files, language=ref.language, name=None)


def describe_source(ref: DatasetRef, sources: Mapping[str, str]) -> str:
    """``ref`` in words, with the local copy it is read from when ``data.sources`` maps it (or its own files)."""
    resolved = resolve_source(ref, sources)
    if resolved == ref:
        return ref.describe() + (f" from {_files(ref.data_files)}" if ref.data_files else "")
    return f"{ref.describe()} from {_files(resolved.data_files) if resolved.data_files else resolved.path}"


def describe_read(ref: DatasetRef, sources: Mapping[str, str]) -> str:
    """What ``ref`` is read from, the file(s) first: ``/data/en/train.jsonl (split train)``, or a folder or Hub id
    with its config, ``data/xnli (config en, split train)``."""
    resolved = resolve_source(ref, sources)
    if resolved.data_files:
        return f"{_files(resolved.data_files)} (split {ref.split})"
    config = f"config {resolved.name}, " if resolved.name else ""
    return f"{resolved.path} ({config}split {ref.split})"


def _files(data_files: object) -> str:
    """``data_files`` (a path, a list of them, or a mapping from split to either) as text."""
    if isinstance(data_files, Mapping):
        return ", ".join(f"{split}: {_files(files)}" for split, files in data_files.items())
    if isinstance(data_files, (list, tuple)):
        return ", ".join(map(str, data_files))
    return str(data_files)


def load_split(
    ref: DatasetRef,
    sources: Mapping[str, str] = {},
    cache_dir: Optional[str] = None,
) -> datasets.Dataset:
    """``datasets.load_dataset`` for ``ref``, with one clear :class:`DataError` when it cannot be had."""
    resolved = check_local_files(ref, sources)
    if resolved != ref:
        cache_dir = _local_cache_dir(resolved, cache_dir)
    try:
        with _quiet_datasets():
            return datasets.load_dataset(
                resolved.path,
                resolved.name,
                split=resolved.split,
                data_files=resolved.data_files,
                cache_dir=cache_dir,
            )
    except (ConnectionError, FileNotFoundError, ValueError, datasets.exceptions.DatasetNotFoundError) as exc:
        hint = ""
        if resolved.path == ref.path and not Path(ref.path).exists():
            hint = (
                "; without Hub access, map the id to a local copy with data.sources, or load it once where "
                "the Hub is reachable so that the datasets cache holds it"
            )
        raise DataError(f"cannot load {_what(ref, resolved)}: {_detail(exc)}{hint}") from None
    except (StopIteration, datasets.exceptions.DatasetGenerationError, UnicodeDecodeError, OSError) as exc:
        # a local file the user wrote: empty (StopIteration in the json builder), a malformed line, not UTF-8
        raise DataError(f"cannot load {_what(ref, resolved)}: {_detail(exc)}") from None


@contextlib.contextmanager
def one_module_per_dataset() -> Iterator[None]:
    """Within the block, each dataset (Hub id or folder) is read once, not once per config and split loaded.

    ``datasets.load_dataset(path, name, split=...)`` starts by building the dataset's module: it reads the dataset
    card (a pure-Python YAML parse of every config), resolves every config's data files and hashes the result --
    on the Hub, with requests -- and does so again for each config and split. A run of WikiANN in 48 languages
    loads 144 splits from one card, each paying 0.25 s for the fixtures' card here and more over the network.
    ``datasets`` has no public way to build a builder from a module already built, so its module factory is
    memoized for the block. Each caller gets a copy with its own ``builder_kwargs``, which ``load_dataset_builder``
    pops from; the configs are shared, as they are among the builders of one module (a builder resolves its
    config's data files in place, once). The block is one run's loading of its data, within which the files are not
    expected to change; outside it every load reads the dataset afresh, as ``datasets`` does."""
    import datasets.load as loader

    factory = loader.dataset_module_factory
    modules: dict[str, Any] = {}

    def reused(*args, **kwargs):
        key = repr((args, sorted(kwargs.items())))
        if key not in modules:
            modules[key] = factory(*args, **kwargs)
        module = copy.copy(modules[key])
        module.builder_kwargs = dict(module.builder_kwargs)
        return module

    loader.dataset_module_factory = reused
    try:
        yield
    finally:
        loader.dataset_module_factory = factory


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[None]:
    """The ``datasets`` loggers silenced while a split loads: on a malformed line the json builder logs the error
    itself before raising it, and the user is to see one line, the :class:`DataError` that names the file."""
    library = logging.getLogger("datasets")
    level = library.level
    library.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        library.setLevel(level)


_BLANK_CHECK = 1 << 16  # a named file this small is read whole to see whether it holds more than whitespace


def check_local_files(ref: DatasetRef, sources: Mapping[str, str] = {}) -> DatasetRef:
    """Refuse, with one :class:`DataError` naming the file, a local file ``ref`` would be read from (through
    ``data.sources``, or the task's own ``data_files``) that is missing, empty or not UTF-8 text; return ``ref``
    resolved. Files of a Hub-layout folder are checked for UTF-8 only. A Hub dataset is not looked at."""
    resolved = resolve_source(ref, sources)
    for file, named in _local_files(resolved):
        if not file.is_file():
            raise DataError(f"dataset file not found: {file} (for {ref.describe()})")
        stat = file.stat()  # of the file itself, through any link: the key below is the file's, not its path's
        key = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
        if key in _VALID:
            continue
        if named and (stat.st_size == 0 or stat.st_size <= _BLANK_CHECK and not file.read_bytes().strip()):
            raise DataError(f"cannot load {file} (for {ref.describe()}): the file is empty (no rows)")
        where = utf8_error(file) if file.suffix in _TEXT_FORMATS else None
        if where:
            raise DataError(f"cannot load {file} (for {ref.describe()}): not UTF-8 text ({where})")
        _VALID.add(key)
    return resolved


def _local_files(resolved: DatasetRef) -> Iterator[tuple[Path, bool]]:
    """The local files of ``resolved``, each with whether it was named (a data file) rather than found in a folder."""
    if resolved.data_files is not None:
        named = resolved.data_files
        if isinstance(named, dict):  # split -> file(s)
            named = [f for files in named.values() for f in ([files] if isinstance(files, (str, Path)) else files)]
        for file in [named] if isinstance(named, (str, Path)) else named:
            yield Path(file), True
    elif Path(resolved.path).is_dir():
        for file in sorted(Path(resolved.path).rglob("*")):
            if file.suffix in _TEXT_FORMATS and file.is_file():
                yield file, False


def _what(ref: DatasetRef, resolved: DatasetRef) -> str:
    """The file the user wrote when the split comes from one (not the packaged builder's 'json split train')."""
    if resolved.data_files is not None:
        return f"{resolved.data_files} (for {ref.describe()})"
    return ref.describe() if resolved == ref else f"{resolved.path} (for {ref.describe()})"


def _detail(exc: BaseException) -> str:
    """The root cause of ``exc`` in one line of at most 200 characters (``datasets`` wraps the parser's error)."""
    if isinstance(exc, StopIteration):
        return "the file is empty (no rows)"
    while exc.__cause__ is not None or (exc.__context__ is not None and not str(exc).strip()):
        exc = exc.__cause__ or exc.__context__
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 text (byte {exc.start})"
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, datasets.exceptions.DatasetGenerationError):
        text = f"{text} (a malformed row?)"
    return text if len(text) <= 200 else text[:200] + "..."


def _local_cache_dir(resolved: DatasetRef, cache_dir: Optional[str]) -> str:
    """A cache folder keyed by the local files' paths, sizes and modification times.

    ``datasets`` keys the cache of a local Hub-layout folder on its metadata only, so edited files would be
    served stale from an earlier run's Arrow cache (and so would their tokenisation); a key over the files
    themselves makes every edit load afresh.
    """
    root = Path(resolved.data_files or resolved.path)
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
    digest = hashlib.sha256()
    for file in files:
        stat = file.stat()
        digest.update(f"{file.resolve()}|{stat.st_size}|{stat.st_mtime_ns}\n".encode())
    base = Path(cache_dir) if cache_dir else Path(datasets.config.HF_DATASETS_CACHE)
    return str(base / "mtft-local" / digest.hexdigest()[:20])
