"""The Gaussian probe's σ_init (Springer et al., 2025, eq. 1): every weight matrix of the model is perturbed, a tied
word embedding included whichever name it is reached by, with the initialiser's own σ where the scheme is known."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import BertConfig, XLMRobertaConfig

from mtft.forgetting import probe
from mtft.forgetting.mlm import MaskedLM, load_mlm_model, split_mlm_model
from mtft.forgetting.probe import gaussian_probe, init_stds

WORDS = "encoder.embeddings.word_embeddings.weight"
# the tiny masked-LM of issue 28: the e2e base's encoder (64 wide, 2 layers, 128 intermediate) over a 234-token
# vocabulary and 32-token texts; 71,872 of its 86,848 matrix weights were perturbed before the fix
TINY = dict(
    vocab_size=234,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    max_position_embeddings=34,
    type_vocab_size=1,
    pad_token_id=1,
)


def masked_lm(config) -> tuple[MaskedLM, nn.Module]:
    """``config``'s masked-LM as the probe sees it, and the fresh model the probe reads σ_init from."""
    encoder, head, tied = split_mlm_model(load_mlm_model("tiny", None, False, config))
    return MaskedLM(encoder, head, tied), load_mlm_model("tiny", None, False, config)


def perturbed_count(mlm: MaskedLM, stds: dict[str, float]) -> int:
    return gaussian_probe(mlm, stds, lambda: {"x": 0.0}, [], 3).perturbed  # no γ: the baseline alone


def matrix_weights(mlm: nn.Module) -> int:
    return sum(p.numel() for p in mlm.parameters() if p.ndim >= 2)  # each tensor once, tied or not


def test_the_tied_word_embeddings_of_the_tiny_masked_lm_get_the_initialisers_sigma():
    mlm, fresh = masked_lm(XLMRobertaConfig(**TINY))
    assert mlm.head.decoder.weight is mlm.encoder.embeddings.word_embeddings.weight  # tied
    stds = init_stds(mlm, fresh)
    assert stds[WORDS] == 0.02 == fresh.config.initializer_range  # 0.0 before the fix
    assert stds["head.decoder.weight"] == 0.02  # the same tensor by its other name
    # the initialiser's σ, not one draw's sample std (0.0234 for this 64-entry embedding before the fix)
    assert stds["encoder.embeddings.token_type_embeddings.weight"] == 0.02
    assert stds["encoder.encoder.layer.1.attention.self.query.weight"] == 0.02
    assert stds["encoder.encoder.layer.0.output.LayerNorm.weight"] == 0.0  # initialised to ones: σ_init = 0
    assert stds["head.dense.bias"] == 0.0 and stds["head.bias"] == 0.0  # zeros
    assert perturbed_count(mlm, stds) == matrix_weights(mlm) == 86_848


def test_the_probe_perturbs_the_word_embeddings_by_gamma_sigma():
    mlm, fresh = masked_lm(XLMRobertaConfig(**TINY))
    before = mlm.encoder.embeddings.word_embeddings.weight.detach().clone()
    evaluate = lambda: {"x": float((mlm.encoder.embeddings.word_embeddings.weight - before).std())}  # noqa: E731
    result = gaussian_probe(mlm, init_stds(mlm, fresh), evaluate, [2.0], 3)
    assert result.baseline == {"x": 0.0}
    assert [t["lp"]["x"] for t in result.trials] == pytest.approx([2.0 * 0.02] * 3, rel=0.05)
    assert torch.equal(mlm.encoder.embeddings.word_embeddings.weight, before)


def test_an_untied_head_gets_its_own_sigma_and_is_counted():
    mlm, fresh = masked_lm(XLMRobertaConfig(**TINY, tie_word_embeddings=False))
    assert mlm.head.decoder.weight is not mlm.encoder.embeddings.word_embeddings.weight
    stds = init_stds(mlm, fresh)
    assert stds[WORDS] == stds["head.decoder.weight"] == 0.02
    assert stds["encoder.embeddings.token_type_embeddings.weight"] == 0.02
    assert perturbed_count(mlm, stds) == matrix_weights(mlm) == 86_848 + 234 * 64


def test_a_bert_backbone_and_an_unknown_scheme_perturb_every_matrix(monkeypatch):
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    mlm, fresh = masked_lm(config)
    assert fresh.base_model_prefix == "bert"  # its head is "cls", its tied decoder cls.predictions.decoder
    stds = init_stds(mlm, fresh)
    assert stds[WORDS] == stds["head.predictions.decoder.weight"] == 0.02
    assert perturbed_count(mlm, stds) == matrix_weights(mlm)
    # a family whose scheme is not known: the fallback, each tensor's sample std in the fresh initialisation
    monkeypatch.setattr(probe, "NORMAL_INIT", frozenset())
    stds = init_stds(mlm, fresh)
    assert (
        stds[WORDS]
        == stds["head.predictions.decoder.weight"]
        == float(fresh.bert.embeddings.word_embeddings.weight.detach().double().std())
    )
    assert stds[WORDS] == pytest.approx(0.02, rel=0.1) and stds[WORDS] != 0.02
    assert stds["encoder.encoder.layer.0.output.LayerNorm.weight"] == 0.0
    assert perturbed_count(mlm, stds) == matrix_weights(mlm)


def test_a_parameter_with_no_initialisation_is_an_error_not_left_alone():
    mlm, fresh = masked_lm(XLMRobertaConfig(**TINY))
    mlm.encoder.extra = nn.Linear(2, 2)
    with pytest.raises(RuntimeError, match="no initialisation known for 2 parameter"):
        init_stds(mlm, fresh)
