"""The models every bufferless-store test runs (full fine-tuning, LoRA, Multi-LoRA, MHLoss heads), the one-head
row layout, and a fixed weighting for the layer-by-layer Gram's float64 tables."""

from __future__ import annotations

import numpy as np
import torch

from mtft.adapters.multi_lora import inject_multi_lora, multi_lora_layers
from mtft.adapters.options import MultiLoraOptions
from mtft.weighting import build_weighting
from tests.helpers.gradients import lora_model
from tests.helpers.models import tiny_model


def full(tmp_path):
    return tiny_model(tmp_path)


def multi_lora(tmp_path):
    model, tok = tiny_model(tmp_path)
    inject_multi_lora(model.encoder, MultiLoraOptions(r=4, target_modules=["query", "value", "output.dense"]), 2, 3)
    for layer in multi_lora_layers(model):
        torch.nn.init.normal_(layer.lora_B.weight, std=0.2)
    return model, tok


def mhloss(tmp_path):
    model, tok = tiny_model(tmp_path)
    torch.manual_seed(0)
    for head in model.heads.values():  # each task's classifier as three heads (MHLoss)
        head.use_heads(3)
    return model, tok


MODELS = {"full": full, "lora": lora_model, "multi_lora": multi_lora, "mhloss": mhloss}


# rows of 3 objectives, mixed and padded; SPANNING: objective 0 has rows of both tasks; ONE_HEAD: every row is the
# first task's, so the second task's head runs on no rows (a step of a multi-task run that drew none of its rows)
ONE_HEAD = dict(objectives=[2, 0, 1, 1, 0, 2, 1, 0], heads=[0] * 8, labels=[1, 0, 0, 1, 0, 1, 1, 0])


class Fixed(build_weighting("mean").__class__):
    """Fixed weights, and what the step handed over."""

    name, needs_gram = "fixed_for_tests", True

    def __init__(self, weights):
        super().__init__()
        self.weights, self.seen = weights, None

    def weigh(self, losses, gram):
        self.seen = gram
        return np.asarray(self.weights, dtype=np.float64)
