"""Reading a model or run folder that mtft did not necessarily write -- a colleague's run, a downloaded model, a
folder damaged by a full disk or edited by hand -- the one way every command reads one.

Two rules, whatever the folder holds:

- **No code from data.** A ``config.json`` or ``tokenizer_config.json`` with an ``auto_map`` asks transformers to
  import a Python file that ships with the folder. mtft refuses such a run folder in one line (before anything
  loads), and passes ``trust_remote_code=False`` explicitly everywhere it reads one, so transformers never asks
  on stdin either. (A backbone the user names with ``model.trust_remote_code: true`` is the user's own choice, made
  in their config: :mod:`mtft.models.backbone` honours it.) Weights are read with safetensors, never unpickled.
- **One line per failure.** Whatever a broken file raises -- not JSON, not UTF-8, a truncated or non-safetensors
  weights file, a tokenizer that does not load -- becomes one :class:`~mtft.core.errors.CheckpointError` (or the
  caller's error class) naming the file and the first line of what is wrong.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Iterator, Optional, Type

from safetensors import SafetensorError

from mtft.core.errors import CheckpointError, ConfigError, UserError, shorten

#: what reading a broken file raises, in json, safetensors, tokenizers and transformers
LOAD_ERRORS = (OSError, ValueError, TypeError, KeyError, IndexError, RuntimeError, AttributeError, SafetensorError)
#: files whose ``auto_map`` names Python code in the folder
CODE_MAPS = ("config.json", "tokenizer_config.json")
#: a tokenizer's files, one of which a folder must hold (transformers builds an empty tokenizer without them)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "sentencepiece.bpe.model", "spiece.model")


@contextlib.contextmanager
def reading(path: Path | str, error: Type[UserError] = CheckpointError) -> Iterator[None]:
    """Turn any failure of the block into one ``error`` line: ``<path>: <first line of what went wrong>``."""
    try:
        yield
    except UserError:
        raise
    except LOAD_ERRORS as exc:
        raise error(f"{path}: {first_line(exc)}") from None


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return shorten(text.splitlines()[0] if text else type(exc).__name__)


def read_json(path: Path, what: str = "a JSON object") -> Any:
    """The JSON value in ``path``, or one line naming the file (missing, not UTF-8, not JSON)."""
    with reading(path):
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise CheckpointError(f"{path}: missing") from None
        except UnicodeDecodeError:
            raise CheckpointError(f"{path}: not UTF-8 text") from None
        try:
            return json.loads(text)
        except ValueError as exc:
            raise CheckpointError(f"{path}: not JSON ({exc}); expected {what}") from None


def code_map(folder: Path) -> Optional[tuple[Path, Any]]:
    """(file, its ``auto_map``) where ``folder``'s config or tokenizer config maps a class to code in the folder."""
    for name in CODE_MAPS:
        path = Path(folder) / name
        if path.is_file():
            value = read_json(path)
            if isinstance(value, dict) and value.get("auto_map"):
                return path, value["auto_map"]
    return None


def refuse_remote_code(folder: Path, what: str = "run folder") -> None:
    """Refuse ``folder`` in one line where it maps a class to code of its own (:func:`code_map`)."""
    found = code_map(folder)
    if found:
        raise CheckpointError(
            f"{found[0]} asks to run Python code shipped with the {what} (auto_map {shorten(json.dumps(found[1]))});"
            f" mtft runs no code from a {what}: remove auto_map"
        )


def check_backbone_code(backbone: str, trust_remote_code: bool) -> None:
    """A local ``model.backbone`` folder that maps classes to its own code loads only with the user's
    ``model.trust_remote_code: true`` (transformers would otherwise load its built-in class in silence, which may
    not be the model the folder describes)."""
    if trust_remote_code or not Path(backbone).is_dir():
        return
    try:
        found = code_map(Path(backbone))
    except CheckpointError as error:
        raise ConfigError(f"cannot load model.backbone={backbone!r}: {error}") from None
    if found:
        raise ConfigError(
            f"model.backbone: {found[0]} asks to run Python code shipped with the folder (auto_map "
            f"{shorten(json.dumps(found[1]))}); set model.trust_remote_code: true if you trust it"
        )


def folder_config(folder: Path, what: str = "run folder"):
    """The transformers config in ``folder``, with no code run from it."""
    from transformers import AutoConfig

    refuse_remote_code(folder, what)
    with reading(Path(folder) / "config.json"):
        return AutoConfig.from_pretrained(str(folder), trust_remote_code=False)


def folder_tokenizer(folder: Path, what: str = "run folder"):
    """The tokenizer in ``folder``, with no code run from it."""
    from transformers import AutoTokenizer

    refuse_remote_code(folder, what)
    if not any((Path(folder) / name).is_file() for name in TOKENIZER_FILES):
        raise CheckpointError(f"{folder} (its tokenizer): none of {', '.join(TOKENIZER_FILES)}")
    with reading(f"{folder} (its tokenizer)"):
        return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
