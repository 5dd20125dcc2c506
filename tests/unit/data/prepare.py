"""``prepare_data`` for a test's whole run configuration."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence

from mtft.config.run_config import RunConfig
from mtft.data.pipeline import PreparedData, prepare_data


def prepare_for(
    config: RunConfig,
    make_tokenizer: Callable[[list[str]], Any],
    trained: Optional[Mapping[str, Sequence[str]]] = None,
) -> PreparedData:
    """What a run of ``config`` prepares: its data section, evaluation split and objective grouping."""
    return prepare_data(config.data, config.evaluation.split, config.weighting.objectives, make_tokenizer, trained)
