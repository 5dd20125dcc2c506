"""What the commands that fill a cache folder from an installed package share (``python -m mtft.fixtures.minilm``,
``python -m mtft.models.e5``): the content hash that names the folder, and printing the folder or one error line."""

from __future__ import annotations

import hashlib
import importlib.metadata
import sys
from pathlib import Path
from typing import Callable, Optional

from mtft.core.errors import ConfigError, UserError


def installed_file(distribution: str, member: str, missing: str, version: Optional[str] = None) -> Path:
    """The file ``member`` of the installed PyPI package ``distribution`` -- of exactly ``version``, when given --
    found through its metadata (the package is never imported). ``missing``: the one line when it is not installed,
    which also ends the line refusing another version."""
    try:
        found = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError(missing) from None
    if version is not None and found.version != version:
        raise ConfigError(f"{distribution} {found.version} is installed; mtft reads the files of {version}: {missing}")
    path = Path(str(found.locate_file(member)))
    if not path.is_file():
        raise ConfigError(f"{distribution} {found.version} has no {member} ({path}); reinstall it")
    return path


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def print_folder(make: Callable[[], Path], doing: str, out: Optional[Path]) -> int:
    """Print the folder ``make`` returns (exit 0), or one ``error:`` line (exit 2): a refusal, or an OS error (no
    permission, a full disk) naming where ``doing`` ("extract all-MiniLM-L6-v2") was going to write."""
    try:
        print(make())
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"error: cannot {doing} into {out or 'the mtft cache'}: {error}", file=sys.stderr)
        return 2
    return 0
