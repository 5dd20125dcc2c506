"""``run.py --config X --prefetch``: download and cache every dataset split a config reads, then stop.

The splits are exactly those a run of the config loads (each task's sources: source_languages or its protocol's,
the evaluation split of every evaluated language), read with the same ``datasets.load_dataset`` call and
cache folder, so a later run with ``HF_DATASETS_OFFLINE=1`` finds them. With a Hub backbone, its tokenizer
and weights are fetched into the Hugging Face cache too. Nothing is written to the run's output directory.
"""

from __future__ import annotations

from typing import Callable

from mtft.config.schema import DataSection, ModelSection, RunConfig
from mtft.data.selection import select_tasks
from mtft.data.sources import describe_source, load_split, one_module_per_dataset
from mtft.tasks.base import DatasetRef


def dataset_refs(data: DataSection, eval_split: str) -> list[DatasetRef]:
    """Every distinct split a run of ``data`` (its tasks) and ``eval_split`` (``evaluation.split``) loads, in
    order."""
    refs: list[DatasetRef] = []
    for chosen in select_tasks(data, eval_split):
        for _, _, ref in chosen.refs(eval_split):
            if ref not in refs:
                refs.append(ref)
    return refs


def prefetch(config: RunConfig, echo: Callable[[str], None] = print) -> int:
    """Load (and so cache) every split; returns how many were fetched."""
    import datasets

    datasets.disable_progress_bars()
    refs = dataset_refs(config.data, config.evaluation.split)
    with one_module_per_dataset():  # a dataset's configs and splits read its card once
        for ref in refs:
            dataset = load_split(ref, config.data.sources, config.data.cache_dir)
            echo(f"cached {describe_source(ref, config.data.sources)}: {len(dataset)} rows")
    if config.model.backbone != "tiny":
        _prefetch_backbone(config.model, config.data.longest_row, config.pretrain.seed, echo)
    return len(refs)


def _prefetch_backbone(model: ModelSection, longest_row: int, seed: int, echo: Callable[[str], None]) -> None:
    from mtft.models.backbone import build_encoder
    from mtft.models.tokenizer import load_backbone_tokenizer

    tokenizer = load_backbone_tokenizer(model.backbone, model.revision, model.trust_remote_code)
    build_encoder(model, tokenizer, longest_row, seed)  # downloads the weights
    echo(f"cached model {model.backbone}" + (f" (revision {model.revision})" if model.revision else ""))
