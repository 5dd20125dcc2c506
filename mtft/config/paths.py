"""Where a run keeps what it can reuse across runs: tokenizers, datasets, pre-trained backbones, λ_p."""

from __future__ import annotations

from pathlib import Path

from mtft.config.schema import DataSection
from mtft.core.paths import default_cache_dir


def cache_dir(data: DataSection) -> Path:
    """``data.cache_dir``, else ``$MTFT_CACHE``, else ``~/.cache/mtft``."""
    return Path(data.cache_dir) if data.cache_dir else default_cache_dir()
