"""``run.py --config X --prefetch``: download and cache every dataset split a config reads, then stop.

The splits are exactly those a run of the config loads (each task's sources: source_languages or its protocol's,
the evaluation split of every evaluated language), read with the same ``datasets.load_dataset`` call and
cache folder, so a later run with ``HF_DATASETS_OFFLINE=1`` finds them. With a Hub backbone, its tokenizer
and weights are fetched into the Hugging Face cache too. Nothing is written to the run's output directory.
"""

from __future__ import annotations

from typing import Callable

from mtft.config.schema import DataSection, ModelSection
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


def prefetch_datasets(data: DataSection, eval_split: str, echo: Callable[[str], None] = print) -> int:
    """Load (and so cache) every split :func:`dataset_refs` names; returns how many were fetched."""
    import datasets

    datasets.disable_progress_bars()
    refs = dataset_refs(data, eval_split)
    with one_module_per_dataset():  # a dataset's configs and splits read its card once
        for ref in refs:
            dataset = load_split(ref, data.sources, data.cache_dir)
            echo(f"cached {describe_source(ref, data.sources)}: {len(dataset)} rows")
    return len(refs)


def prefetch_backbone(model: ModelSection, longest_row: int, seed: int, echo: Callable[[str], None] = print) -> None:
    """Fetch ``model``'s tokenizer and weights into the Hugging Face cache (the tiny encoder has none to fetch);
    ``longest_row`` (``data.longest_row``) and ``seed`` (``pretrain.seed``) as a run builds the encoder."""
    if model.backbone == "tiny":
        return
    from mtft.models.backbone import build_encoder
    from mtft.models.tokenizer import load_backbone_tokenizer

    tokenizer = load_backbone_tokenizer(model.backbone, model.revision, model.trust_remote_code)
    build_encoder(model, tokenizer, longest_row, seed)  # downloads the weights
    echo(f"cached model {model.backbone}" + (f" (revision {model.revision})" if model.revision else ""))
