"""Which code produced a result: a fingerprint of the mtft source that ran.

A study's runs can span days and commits; a run finished before a change to the training code is not comparable
with one finished after it, and nothing in its numbers says so. The fingerprint is a hash of the package's own
``.py`` files (what the run executed, committed or not), plus the git commit when the source is a checkout.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path
from typing import Optional

_PACKAGE = Path(__file__).resolve().parents[1]


def source_fingerprint() -> str:
    """sha256 (first 12 hex digits) over the relative path and bytes of every ``.py`` file of the package: read
    anew at every call (a few milliseconds), since a long study may outlive an edit of its own source."""
    digest = hashlib.sha256()
    for path in sorted(_PACKAGE.rglob("*.py")):
        digest.update(path.relative_to(_PACKAGE).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def git_commit() -> Optional[str]:
    """The checkout's commit (12 hex digits), or None when the package is not in a git work tree."""
    try:
        out = subprocess.run(
            ["git", "-C", str(_PACKAGE), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def code_version() -> dict[str, Optional[str]]:
    """What a run records: the source fingerprint (what decides comparability) and the commit (to find it)."""
    return {"source": source_fingerprint(), "commit": git_commit()}
