"""The shared encoder: any Hugging Face encoder through the Auto classes, or a tiny random XLM-R.

Nothing downstream assumes XLM-R: the tokenizer's own special tokens and segment ids (``token_type_ids``, which
BERT uses for the second text of a pair) travel with every batch, and only the ``tiny`` encoder is built here.
"""

from __future__ import annotations

from pathlib import Path

import torch
from huggingface_hub import constants, try_to_load_from_cache
from huggingface_hub.utils import HFValidationError, validate_repo_id
from transformers import AutoConfig, AutoModel, PreTrainedModel, XLMRobertaConfig

from mtft.config.schema import ModelSection
from mtft.core.errors import ConfigError, echo
from mtft.models.folders import LOAD_ERRORS, check_backbone_code, first_line
from mtft.models.loading import load_pretrained, report_encoder_load
from mtft.models.named_backbones import check_named_backbone, local_backbone
from mtft.reporting.logs import logger


def build_encoder(cfg: ModelSection, tokenizer, max_length: int, init_seed: int) -> PreTrainedModel:
    """The encoder named by ``cfg.backbone``; its pooler is dropped (the heads pool for themselves). ``init_seed``
    initialises the tiny encoder (and whatever a loaded checkpoint lacks)."""
    torch.manual_seed(init_seed)
    if cfg.backbone == "tiny":
        encoder = AutoModel.from_config(tiny_config(cfg, tokenizer, max_length))
    else:
        encoder = _pretrained(cfg)
    if isinstance(getattr(encoder, "pooler", None), torch.nn.Module):
        encoder.pooler = None  # unused parameters would get no gradient, which ZeRO and DDP reject
    return encoder


def check_backbone(cfg: ModelSection) -> None:
    """Refuse, before anything is built, a ``model.backbone`` that cannot load: a folder without ``config.json``, a
    path that does not exist, or -- with the Hub offline (``HF_HUB_OFFLINE=1``) -- a Hub id missing from the Hugging
    Face cache. Online, a Hub id is left to ``from_pretrained`` (checking it would cost a request)."""
    name = cfg.backbone
    if name == "tiny" or check_named_backbone(name):
        return
    what = f"model.backbone={echo(name)}"
    folder = Path(name)
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            raise ConfigError(f"{what}: the folder has no config.json (not a Hugging Face model folder)")
        return
    if folder.exists():
        raise ConfigError(f"{what} is a file; give a model folder or a Hub id")
    try:
        validate_repo_id(name)
    except HFValidationError:
        raise ConfigError(f"{what}: no such folder (and not a Hub id such as 'org/model')") from None
    if constants.HF_HUB_OFFLINE and not isinstance(
        try_to_load_from_cache(name, "config.json", revision=cfg.revision), str
    ):
        raise ConfigError(
            f"{what}: no such folder, and as a Hub id it is not in the Hugging Face cache while the Hub is offline "
            "(HF_HUB_OFFLINE=1); fetch it once with --prefetch where the Hub is reachable, or give a local folder"
        )


def tiny_config(cfg: ModelSection, tokenizer, max_length: int) -> XLMRobertaConfig:
    dropout = 0.1 if cfg.dropout is None else cfg.dropout
    return XLMRobertaConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.tiny.hidden_size,
        num_hidden_layers=cfg.tiny.num_hidden_layers,
        num_attention_heads=cfg.tiny.num_attention_heads,
        intermediate_size=cfg.tiny.intermediate_size,
        max_position_embeddings=max_length + 2,  # XLM-R positions start after the padding index
        type_vocab_size=1,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )


def _pretrained(cfg: ModelSection) -> PreTrainedModel:
    options = dict(revision=cfg.revision, trust_remote_code=cfg.trust_remote_code)
    source = local_backbone(cfg.backbone)
    check_backbone_code(source, cfg.trust_remote_code)
    try:
        config = AutoConfig.from_pretrained(source, **options)
        if cfg.dropout is not None:
            for key in ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "attention_dropout"):
                if hasattr(config, key):
                    setattr(config, key, cfg.dropout)
        if cfg.weights == "random":  # the control: the same architecture, nothing of pre-training
            logger.info(f"model.weights=random: {cfg.backbone}'s architecture, freshly initialised")
            return AutoModel.from_config(config, trust_remote_code=cfg.trust_remote_code)
        encoder, info = load_pretrained(AutoModel, source, config=config, **options)
    except LOAD_ERRORS as exc:
        first = first_line(exc)
        raise ConfigError(f"cannot load model.backbone={cfg.backbone!r}: {first}") from None
    report_encoder_load(cfg.backbone, info)
    return encoder
