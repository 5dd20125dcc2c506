"""Pre-training's loss from logits at the masked positions only: the masked-LM model's own loss (logits at every
position, the unmasked ones ignored) and its gradient, in float64 to round-off, for XLM-R's and BERT's heads."""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertForMaskedLM, XLMRobertaConfig, XLMRobertaForMaskedLM

from mtft.core.labels import IGNORE_INDEX
from mtft.training.pretrain import MaskedPositionsLM

SHAPE = dict(vocab_size=97, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32)
MODELS = {
    "xlm-r": lambda: XLMRobertaForMaskedLM(XLMRobertaConfig(**SHAPE, max_position_embeddings=40)),
    "bert": lambda: BertForMaskedLM(BertConfig(**SHAPE, max_position_embeddings=40)),
}


def masked_batch(rows: int = 4, length: int = 24, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, 97, (rows, length), generator=g)
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    masked = torch.rand(rows, length, generator=g) < 0.15
    masked[:, 3] = True  # every row has a target
    labels[masked] = input_ids[masked]
    attention_mask = torch.ones_like(input_ids)
    attention_mask[-1, -5:] = 0  # padding in one row
    labels[-1, -5:] = IGNORE_INDEX
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


@pytest.mark.parametrize("kind", list(MODELS))
def test_the_loss_and_its_gradient_are_the_models_own(kind):
    torch.manual_seed(0)
    mlm = MODELS[kind]().double().eval()
    batch = masked_batch()
    own = mlm(**batch).loss
    own_grads = torch.autograd.grad(own, list(mlm.parameters()), allow_unused=True)
    ours = MaskedPositionsLM(mlm)(**batch)
    our_grads = torch.autograd.grad(ours, list(mlm.parameters()), allow_unused=True)
    assert ours.item() == pytest.approx(own.item(), rel=1e-13)
    for (name, _), a, b in zip(mlm.named_parameters(), own_grads, our_grads):
        if a is None:
            assert b is None or not b.any(), name
            continue
        torch.testing.assert_close(b, a, rtol=1e-11, atol=1e-14, msg=name)


def test_the_checkpoint_holds_the_masked_lm_under_its_own_names():
    mlm = MODELS["xlm-r"]()
    wrapped = MaskedPositionsLM(mlm)
    names = {name.removeprefix(MaskedPositionsLM.PREFIX) for name in wrapped.state_dict()}
    assert names == set(mlm.state_dict())
