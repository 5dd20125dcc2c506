"""Models and runs for the forgetting monitors' tests: a float64 masked-LM on the tiny encoder, a corpus section,
and a short Multi-LoRA run whose monitor log is collected in memory."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import peft
import torch
from transformers import AutoModel, AutoModelForMaskedLM, XLMRobertaConfig

from mtft.adapters.lora import inject_lora, lora_layers
from mtft.config import validate_config
from mtft.forgetting.corpus import build_eval_set
from mtft.forgetting.mlm import attach_head
from mtft.forgetting.monitor import ForgettingMonitor, ForgettingSetup, MonitorSettings
from mtft.models.tokenizer import tiny_tokenizer
from tests.helpers.models import tiny_model


def tiny_mlm(tmp_path, dtype=torch.float64):
    tok = tiny_tokenizer(["alpha beta gamma delta", "epsilon zeta eta theta", "iota kappa lambda mu"] * 5, 60, tmp_path)
    cfg = XLMRobertaConfig(
        vocab_size=len(tok),
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
        max_position_embeddings=34,
        type_vocab_size=1,
        pad_token_id=tok.pad_token_id,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
    )
    torch.manual_seed(0)
    encoder = AutoModel.from_config(cfg, add_pooling_layer=False).to(dtype)
    return attach_head(encoder, AutoModelForMaskedLM.from_config(cfg)), tok


def corpus_config(**corpus):
    return validate_config(
        {
            "run": {"stage": "pretrain"},
            "data": {"max_length": 32},
            "corpus": {"languages": ["en", "de"], "max_eval_examples": 20, **corpus},
        },
        "test",
    )


TASKS = ["a", "b"]


TARGETS = ["query", "value"]


class Log:
    def __init__(self):
        self.events = []

    def log(self, step, kind, values):
        self.events.append((step, kind, values))


def lora_run(tmp_path, seed: int = 0):
    """A tiny encoder with one PEFT LoRA adapter per task (B's moved off zero, differently per task), its plain
    copy, and the monitor of a run configured with ``lora`` and the forgetting monitors on."""
    model, tok = tiny_model(tmp_path, num_objectives=2)
    plain = copy.deepcopy(model.encoder)
    torch.manual_seed(seed)  # A's initialisation
    inject_lora(model.encoder, peft.LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS), TASKS)
    config = validate_config(
        {
            "model": {"adapter": {"method": "lora", "r": 4, "alpha": 8.0, "target_modules": TARGETS}},
            "data": {"tasks": [{"name": "xnli"}], "max_length": 16, "cache_dir": str(tmp_path / "cache")},
            "weighting": {"method": "mean"},
            "corpus": {"languages": ["en", "de"], "max_eval_examples": 8},
            "forgetting": {
                "enabled": True,
                "batch_size": 8,
                "hessian_examples": 4,
                "prediction_examples": 4,
                "eigen_iterations": 10,
            },
        },
        "test",
    )
    eval_set = build_eval_set(config.corpus, config.data, tok, ["en", "de"], 16)
    settings = MonitorSettings(
        config.forgetting, config.corpus, config.data, log_every=1, replicate=False, pretrained_on_corpus=False
    )
    setup = ForgettingSetup(settings, eval_set, config.model)
    engine = SimpleNamespace(module=model, device=torch.device("cpu"), gradient_accumulation_steps=lambda: 1)
    data = SimpleNamespace(tasks=dict.fromkeys(TASKS), head_tasks=lambda: list(TASKS), objective_names=["a/en", "b/en"])
    monitor = ForgettingMonitor(setup, engine, data, True, tmp_path)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for layer in lora_layers(model.encoder):
            for task, scale in zip(TASKS, (0.5, 2.0)):
                b = layer.lora_B[task].weight
                b.copy_(scale * torch.randn(b.shape, generator=generator))
    return model, plain, monitor
