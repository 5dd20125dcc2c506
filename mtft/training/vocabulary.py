"""``model.vocabulary: used``: the backbone a run fine-tunes, cut to the word pieces of the run's own texts.

The stage runs after the backbone is resolved (pre-trained, re-trained by SURT) and before the data is tokenised:
it reads every text the run will tokenise -- the tasks' training and evaluation splits, and with the forgetting
monitors the corpus of L_p, the retrieval bitext and the prefixes they add -- keeps the pieces the backbone's
tokenizer cuts them into (:mod:`mtft.models.vocabulary`), and hands the run a cached folder holding the cut
checkpoint and tokenizer. Everything after it (the tokenizer of the data, the encoder, the monitors' L_p, the run's
``encoder/`` folder, so predict, evaluate and export) reads that folder: the ids are remapped once, consistently.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from mtft.config.paths import cache_dir
from mtft.config.run_config import RunConfig
from mtft.config.schema import ModelSection
from mtft.core.atomic import AtomicFolder
from mtft.core.distributed import ProcessInfo, barrier
from mtft.data.pipeline import task_texts
from mtft.forgetting.corpus import corpus_languages, corpus_texts
from mtft.forgetting.retrieval import load_bitext, retrieval_pairs
from mtft.models.named_backbones import NAMED
from mtft.models.tokenizer import load_backbone_tokenizer
from mtft.models.vocabulary import check_reducible, kept_ids, write_reduced_backbone
from mtft.reporting.logs import logger
from mtft.training.pretrain import task_languages
from mtft.training.stage_cache import content_digest, from_cache_or_fill

VOCABULARY_VERSION = "1"  # bump when the cut folder written for the same backbone and pieces changes


def run_texts(config: RunConfig) -> list[str]:
    """Every text the run tokenises: its tasks' splits, and with the monitors their corpus, bitext and prefixes."""
    texts = task_texts(config.data, config.evaluation.split)
    forgetting = config.forgetting
    if not forgetting.enabled:
        return texts
    languages = corpus_languages(config.corpus, task_languages(config))
    for language in languages:
        texts += corpus_texts(config.corpus, config.data, language, config.corpus.eval_split)
    if forgetting.lp == "contrastive":
        texts += [forgetting.contrastive.query_prefix, forgetting.contrastive.passage_prefix]
    if forgetting.retrieval.enabled:
        for pair in retrieval_pairs(forgetting.retrieval, languages):
            bitext = load_bitext(forgetting.retrieval, config.corpus, config.data, pair)
            texts += [forgetting.retrieval.prefix + t for t in bitext.source + bitext.target]
    return texts


def reduced_backbone(config: RunConfig, model: ModelSection, proc: ProcessInfo) -> ModelSection:
    """``model`` itself, or -- with ``model.vocabulary: used`` -- a copy whose backbone is its checkpoint cut to the
    run's pieces, from the cache or written now (rank 0 writes, the others wait)."""
    if config.model.vocabulary != "used":
        return model
    tokenizer = load_backbone_tokenizer(model.backbone, model.revision, model.trust_remote_code)
    check_reducible(tokenizer, model.backbone)
    kept = kept_ids(tokenizer, run_texts(config))
    identity = {"backbone": model.backbone, "revision": model.revision}
    if model.backbone not in NAMED and Path(model.backbone).is_dir():  # a named backbone's folder is content-keyed
        identity = {"folder_content": content_digest(Path(model.backbone), Path(model.backbone))}
    key = hashlib.sha256(json.dumps({"v": VOCABULARY_VERSION, **identity, "kept": kept}).encode()).hexdigest()[:24]
    folder = cache_dir(config.data) / "vocabulary" / key

    def write() -> None:
        if proc.is_main:
            with AtomicFolder(folder).writing(kind="backbone", source=model.backbone, pieces=len(kept)) as out:
                write_reduced_backbone(model.backbone, model.revision, model.trust_remote_code, tokenizer, kept, out)

    from_cache_or_fill(folder, proc, "the backbone cut to the run's vocabulary", write)
    barrier()
    read = "task data and the monitors' texts" if config.forgetting.enabled else "task data"
    logger.info(
        f"model.vocabulary=used: {len(kept):,} of the {len(tokenizer):,} word pieces of {model.backbone} are the run's "
        f"(its {read}): the embedding table holds those rows only -> {folder}"
    )
    return model.model_copy(update={"backbone": str(folder), "revision": None})
