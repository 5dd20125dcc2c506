"""build_model with stability.mixout: the run's encoder gets Mixout on its linear layers (u = θ_p, dropout off),
the heads keep theirs, and a method that claims to train the encoder but leaves nothing trainable is refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch import nn

from mtft.adapters import AdapterMethod
from mtft.config import validate_config
from mtft.core.errors import ConfigError
from mtft.models.mixout import MixoutLinear
from mtft.models.tokenizer import tiny_tokenizer
from mtft.training.setup import build_model
from tests.helpers.data import prepare_for
from tests.helpers.launch import REPO

SOURCES = {"nyu-mll/glue": str(REPO / "tasks/glue/fixtures/glue")}


def raw_config(**sections) -> dict:
    return {
        "data": {"sources": SOURCES, "tasks": [{"name": "glue_rte", "max_train_examples": 4}], "max_length": 32},
        "model": {
            "tiny": {"vocab_size": 300, "hidden_size": 16, "num_attention_heads": 2, "intermediate_size": 32},
            "dropout": 0.1,
            "classifier_dropout": 0.1,
            **sections.pop("model", {}),
        },
        "weighting": {"method": "mean", "options": {}},
        **sections,
    }


def built(**sections):
    config = validate_config(raw_config(**sections), source="test")
    data = prepare_for(config, lambda texts: tiny_tokenizer(texts, 300, Path(os.environ["MTFT_CACHE"])))
    return build_model(config, data)


def test_mixout_swaps_the_encoders_linear_layers_towards_theta_p_and_leaves_the_heads():
    plain = built()
    mixed = built(stability={"mixout": 0.2})
    layers = [m for m in mixed.encoder.modules() if isinstance(m, MixoutLinear)]
    assert layers and not [m for m in mixed.encoder.modules() if type(m) is nn.Linear]
    assert all(m.p == 0.2 for m in layers)
    assert any(m.p == 0.1 for m in plain.encoder.modules() if isinstance(m, nn.Dropout))  # model.dropout
    assert all(m.p == 0.0 for m in mixed.encoder.modules() if isinstance(m, nn.Dropout))
    assert any(m.p == 0.1 for m in mixed.heads.modules() if isinstance(m, nn.Dropout))
    assert not [m for m in mixed.heads.modules() if isinstance(m, MixoutLinear)]
    # same seeds: u is the weights plain fine-tuning starts from, and the state dicts are the same
    state, reference = mixed.state_dict(), plain.state_dict()
    assert state.keys() == reference.keys() and all(torch.equal(state[k], reference[k]) for k in state)
    query = mixed.encoder.encoder.layer[0].attention.self.query
    assert torch.equal(query.target, reference["encoder.encoder.layer.0.attention.self.query.weight"])


class FrozenButClaimsToTrain(AdapterMethod):
    """A user's method that says it trains the encoder but freezes it."""

    name = "frozen_but_claims_to_train"
    trains_encoder = True

    def inject(self, encoder, task_names, objective_names, seed):
        encoder.requires_grad_(False)


def test_a_method_leaving_no_trainable_linear_layer_is_refused():
    method = f"{__name__}:FrozenButClaimsToTrain"
    with pytest.raises(ConfigError, match="leaves no trainable linear layer in the encoder to apply Mixout to"):
        built(stability={"mixout": 0.2}, model={"adapter": {"method": method}})
