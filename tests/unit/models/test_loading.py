"""Loading checkpoints whose modules differ from the model class: one mtft line instead of transformers' load
report, a warning for encoder weights the checkpoint lacks, and the masked-LM head a checkpoint has or lacks."""

from __future__ import annotations

import logging

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModel, XLMRobertaConfig, XLMRobertaForMaskedLM

from mtft.config.schema import ModelSection
from mtft.forgetting.mlm import load_mlm_checkpoint, split_mlm_model
from mtft.models.backbone import build_encoder
from mtft.models.loading import modules
from tests.helpers.models import collect
from tests.helpers.tiny_bert import corpus_lines, tiny_bert, wordpiece_tokenizer


@pytest.fixture
def mtft_log():
    yield from collect("mtft")


@pytest.fixture
def transformers_log():
    yield from collect("transformers")


@pytest.fixture(scope="module")
def xlmr_mlm_checkpoint(tmp_path_factory):
    """A masked-LM checkpoint (lm_head, no pooler), as stage pretrain writes and xlm-roberta-base is."""
    folder = tmp_path_factory.mktemp("xlmr")
    config = XLMRobertaConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    )
    torch.manual_seed(0)
    XLMRobertaForMaskedLM(config).save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory):
    """A bare BertModel checkpoint with its pooler and no masked-LM head: all-MiniLM-L6-v2's layout."""
    folder = tmp_path_factory.mktemp("bert")
    return tiny_bert(folder, wordpiece_tokenizer(folder / "vocab", corpus_lines("en")))


def test_encoder_from_a_masked_lm_checkpoint_says_one_line_instead_of_the_load_report(
    xlmr_mlm_checkpoint, mtft_log, transformers_log, capsys
):
    AutoModel.from_pretrained(str(xlmr_mlm_checkpoint))  # transformers on its own reports the differences...
    assert any("lm_head" in r.getMessage() for r in transformers_log)
    transformers_log.clear()
    capsys.readouterr()
    encoder = build_encoder(ModelSection(backbone=str(xlmr_mlm_checkpoint)), None, 16, 0)  # ...mtft in one line
    assert [r.getMessage() for r in transformers_log if r.levelno >= logging.WARNING] == []
    assert "Loading weights" not in capsys.readouterr().err  # nor its progress bar
    [record] = mtft_log
    assert record.levelno == logging.INFO
    assert "pooler not in the checkpoint: unused" in record.getMessage()
    assert "lm_head.* of the checkpoint ignored" in record.getMessage()
    assert encoder.pooler is None


def test_encoder_weights_missing_from_the_checkpoint_are_a_warning_naming_them(xlmr_mlm_checkpoint, tmp_path, mtft_log):
    folder = tmp_path / "damaged"
    XLMRobertaForMaskedLM.from_pretrained(str(xlmr_mlm_checkpoint)).save_pretrained(str(folder))
    state = load_file(str(folder / "model.safetensors"))
    lost = "roberta.encoder.layer.0.attention.self.query.weight"
    del state[lost]
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    build_encoder(ModelSection(backbone=str(folder)), None, 16, 0)
    warnings = [r.getMessage() for r in mtft_log if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "1 encoder weight(s) not in the checkpoint" in warnings[0]
    assert "encoder.layer.0.attention.self.query.weight" in warnings[0]


def test_masked_lm_checkpoint_keeps_its_head_and_a_bare_encoder_has_none(xlmr_mlm_checkpoint, bert_folder, mtft_log):
    mlm, missing = load_mlm_checkpoint(str(xlmr_mlm_checkpoint), None, False)
    assert missing == []
    reference = XLMRobertaForMaskedLM.from_pretrained(str(xlmr_mlm_checkpoint))
    torch.testing.assert_close(mlm.lm_head.dense.weight, reference.lm_head.dense.weight, rtol=0, atol=0)

    mlm, missing = load_mlm_checkpoint(str(bert_folder), None, False)
    assert missing and all(key.startswith("cls.") for key in missing)
    _, head, tied = split_mlm_model(mlm)
    assert tied is not None and tied.weight is mlm.bert.embeddings.word_embeddings.weight
    assert [r.getMessage() for r in mtft_log if r.levelno >= logging.WARNING] == []  # the encoder is complete
    assert any("pooler.* of the checkpoint ignored" in r.getMessage() for r in mtft_log)


def test_modules_names_top_level_modules_below_the_base_model_prefix():
    keys = ["pooler.dense.weight", "pooler.dense.bias", "lm_head.decoder.bias", "bert.encoder.layer.0.x"]
    assert modules(keys) == ["bert.*", "lm_head.*", "pooler.*"]
    assert modules(keys, "bert") == ["bert.encoder.*", "lm_head.*", "pooler.*"]
