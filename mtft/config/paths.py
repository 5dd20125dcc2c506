"""Where a run keeps what it can reuse across runs: tokenizers, datasets, pre-trained backbones, λ_p."""

from __future__ import annotations

import os
from pathlib import Path

from mtft.config.schema import RunConfig


def cache_dir(config: RunConfig) -> Path:
    """``data.cache_dir``, else ``$MTFT_CACHE``, else ``~/.cache/mtft``."""
    return Path(config.data.cache_dir or os.environ.get("MTFT_CACHE") or Path.home() / ".cache" / "mtft")
