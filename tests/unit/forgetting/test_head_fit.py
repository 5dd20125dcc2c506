"""The masked-LM head fitted to θ_p for a backbone that ships none: it measures something (held-out L_p well below
a random head's), leaves θ_p as it was, is cached by content, and a fit that cannot happen refuses in one line."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModel

from mtft.config import validate_config
from mtft.core.errors import DataError
from mtft.forgetting.corpus import build_eval_set
from mtft.forgetting.head_fit import fitted_head
from mtft.forgetting.mlm import attach_head, load_mlm_checkpoint, lp_per_language, split_mlm_model
from mtft.forgetting.monitor import masked_lm_for_lp
from tests.helpers.models import collect
from tests.helpers.tiny_bert import corpus_lines, tiny_bert, wordpiece_tokenizer

LANGUAGES = ["en", "de"]


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """A bare BertModel checkpoint (no masked-LM head, as all-MiniLM-L6-v2) and its WordPiece tokenizer."""
    folder = tmp_path_factory.mktemp("bert")
    tokenizer = wordpiece_tokenizer(folder / "vocab", corpus_lines(*LANGUAGES))
    return tiny_bert(folder, tokenizer), tokenizer


@pytest.fixture
def mtft_log():
    yield from collect("mtft")


def config_for(tmp_path, backbone, **corpus):
    return validate_config(
        {
            "model": {"backbone": str(backbone)},
            "data": {"tasks": [{"name": "xnli"}], "max_length": 32, "cache_dir": str(tmp_path / "cache")},
            "corpus": {"languages": LANGUAGES, "max_eval_examples": 64, **corpus},
            "forgetting": {"enabled": True, "head_fit": {"steps": 150, "examples": 300, "lr": 3e-3}},
        },
        "test",
    )


def held_out_lp(backbone, mlm_model, config, tokenizer) -> dict[str, float]:
    """L_p at θ_p: a fresh copy of the encoder (as a run builds it) under the head of ``mlm_model``."""
    eval_set = build_eval_set(config.corpus, config.data, tokenizer, LANGUAGES, config.data.max_length)
    return lp_per_language(attach_head(AutoModel.from_pretrained(str(backbone)), mlm_model), eval_set, 32, "cpu")


def _sections(config):
    """What fitted_head reads of a run's config: forgetting.head_fit, corpus, data."""
    return config.forgetting.head_fit, config.corpus, config.data


def test_fitted_head_measures_held_out_lp_and_leaves_theta_p_untouched(bert, tmp_path):
    folder, tokenizer = bert
    config = config_for(tmp_path, folder)
    unfitted, missing = load_mlm_checkpoint(str(folder), None, False)
    assert missing  # no head in the checkpoint: transformers initialised one at random
    random_lp = held_out_lp(folder, unfitted, config, tokenizer)

    mlm, _ = load_mlm_checkpoint(str(folder), None, False)
    theta_p = {name: p.detach().clone() for name, p in mlm.bert.named_parameters()}
    how = fitted_head(mlm, tokenizer, *_sections(config), LANGUAGES, str(folder))
    assert how.startswith("a masked-LM head fitted to θ_p (the checkpoint ") and "training loss" in how
    for name, p in mlm.bert.named_parameters():
        assert torch.equal(p, theta_p[name]), name  # θ_p frozen, the tied decoder (its embedding) included
    _, head, tied = split_mlm_model(mlm)
    assert tied.weight is mlm.bert.embeddings.word_embeddings.weight

    fitted_lp = held_out_lp(folder, mlm, config, tokenizer)
    for language in LANGUAGES:  # ~ln(vocabulary) for a random head; 0.7 nats less once fitted to this random BERT
        assert fitted_lp[language] < random_lp[language] - 0.5, (fitted_lp, random_lp)
    [entry] = [p for p in (tmp_path / "cache" / "mlm_heads").iterdir() if p.is_dir()]  # beside its lock file
    fit = json.loads((entry / "fit.json").read_text())
    assert fit["loss_last"] < fit["loss_first"] and fit["tied_decoder"] is True
    assert fit["fitted_parameters"] == sum(p.numel() for p in head.parameters()) - tied.weight.numel()


def test_fitted_head_is_cached_by_theta_p_and_loaded_bit_exactly(bert, tmp_path, mtft_log):
    folder, tokenizer = bert
    config = config_for(tmp_path, folder)
    first, _ = load_mlm_checkpoint(str(folder), None, False)
    fitted_head(first, tokenizer, *_sections(config), LANGUAGES, str(folder))
    [entry] = [p for p in (tmp_path / "cache" / "mlm_heads").iterdir() if p.is_dir()]  # beside its lock file
    written = (entry / "head.safetensors").stat().st_mtime_ns

    second, _ = load_mlm_checkpoint(str(folder), None, False)  # another random head before loading
    mtft_log.clear()
    fitted_head(second, tokenizer, *_sections(config), LANGUAGES, str(folder))
    assert any("from the cache" in r.getMessage() for r in mtft_log)
    assert (entry / "head.safetensors").stat().st_mtime_ns == written
    for (name, a), b in zip(split_mlm_model(first)[1].named_parameters(), split_mlm_model(second)[1].parameters()):
        assert torch.equal(a, b), name
    assert set(load_file(str(entry / "head.safetensors"))) == {
        "predictions.bias",
        "predictions.transform.dense.weight",
        "predictions.transform.dense.bias",
        "predictions.transform.LayerNorm.weight",
        "predictions.transform.LayerNorm.bias",
    }  # the tied decoder is θ_p's embedding, not stored

    other, _ = load_mlm_checkpoint(str(folder), None, False)
    with torch.no_grad():
        other.bert.encoder.layer[0].output.dense.weight[0, 0] += 1.0  # another θ_p: another head
    fitted_head(other, tokenizer, *_sections(config), LANGUAGES, str(folder))
    assert len(list((tmp_path / "cache" / "mlm_heads").glob("[0-9a-f]*"))) == 2


def test_a_head_that_cannot_be_fitted_refuses_in_one_line_and_caches_nothing(bert, tmp_path):
    folder, tokenizer = bert
    config = config_for(tmp_path, folder, train_split="no_such_split")
    mlm, _ = load_mlm_checkpoint(str(folder), None, False)
    with pytest.raises(DataError) as error:
        fitted_head(mlm, tokenizer, *_sections(config), LANGUAGES, str(folder))
    assert "no_such_split" in str(error.value) and "\n" not in str(error.value)
    assert not (tmp_path / "cache" / "mlm_heads").exists()


def test_the_monitors_take_the_checkpoints_head_or_fit_one(bert, tmp_path, mtft_log):
    folder, tokenizer = bert
    with_head = tiny_bert(tmp_path / "mlm", tokenizer, masked_lm=True)
    config = config_for(tmp_path, with_head)
    mlm, how = masked_lm_for_lp(config.model, tokenizer, *_sections(config), LANGUAGES)
    assert how == f"the masked-LM head of the checkpoint {with_head}"
    assert not (tmp_path / "cache" / "mlm_heads").exists()

    config = config_for(tmp_path, folder)
    mlm, how = masked_lm_for_lp(config.model, tokenizer, *_sections(config), LANGUAGES)
    assert "fitted to θ_p" in how
    assert [r for r in mtft_log if r.levelno >= logging.WARNING] == []
