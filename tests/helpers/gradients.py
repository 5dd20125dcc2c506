"""The gradient engine's test bench: a tiny model's mixed batch (objectives, heads, labels), the slice of the
DeepSpeed engine the steps use, per-objective gradients by hooks, a fixed-Gram weighting and a fixed metric, and the
Gram step checked against the backward of the weighted loss."""

from __future__ import annotations

import numpy as np
import peft
import torch

from mtft.gradients import PerObjectiveGradients
from mtft.pareto import SolverInputError
from mtft.training.gradient_store import gradient_store
from mtft.training.gram_step import GramWeightedStep
from mtft.weighting import Weighting
from tests.helpers.models import batch, tiny_model

TEXTS = [
    "alpha beta",
    "gamma delta epsilon zeta eta theta",
    "zeta",
    "eta theta alpha",
    "beta",
    "delta delta alpha beta gamma",
    "theta",
    "alpha alpha",
]


class FakeEngine:
    """The slice of DeepSpeedEngine the steps use, for in-process tests (the real engine runs in e2e tests)."""

    def __init__(self, module):
        self.module, self.device = module, torch.device("cpu")

    def __call__(self, **batch):
        return self.module(**batch)

    def backward(self, loss):
        loss.backward()

    def step(self):
        pass


class FixedGramWeighting(Weighting):
    name, needs_gram = "fixed_for_tests", True

    def __init__(self, weights=None, fail=False):
        self.weights, self.fail, self.seen = weights, fail, None

    def __call__(self, losses, gram):
        self.seen = gram
        if self.fail:
            raise SolverInputError("gram has NaN/inf entries")
        return np.asarray(self.weights if self.weights is not None else np.full(len(losses), 1 / len(losses)))


def make_batch(tok, objectives, heads, labels, texts=TEXTS):
    return batch(tok, heads, objectives, labels, texts)


MIXED = dict(objectives=[2, 0, 1, 1, 0, 2, 1, 0], heads=[0, 1, 0, 0, 1, 0, 0, 1], labels=[1, 2, 0, 1, 0, 1, 1, 2])


def hooked_gradients(model, batch, num_objectives):
    collector = PerObjectiveGradients(model, num_objectives).attach()
    detached = {n: p.detach() for n, p in model.named_parameters()}
    with collector.capturing():
        sums, _ = torch.func.functional_call(model, detached, args=(), kwargs=batch)
    sums.sum().backward()
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.cat([collector.gradient(p).reshape(num_objectives, -1) for p in params], dim=1), params


def lora_model(tmp_path):
    """The tiny model with PEFT LoRA on query and value, B drawn (B = 0 at init would make A's gradient vanish)."""
    model, tok = tiny_model(tmp_path)
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"], lora_dropout=0.0)
    model.encoder = peft.get_peft_model(model.encoder, lora)
    for name, p in model.encoder.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)
    return model, tok


def gram_step_against_weighted_loss(model, batch, weights):
    """One GramWeightedStep with fixed weights; asserts its update equals autograd's gradient of Σ_t w_t L_t and
    returns the step's result."""
    params = [p for p in model.parameters() if p.requires_grad]
    store = gradient_store(FakeEngine(model), len(weights), 1, params)
    result = GramWeightedStep(store, FixedGramWeighting(weights))([batch])
    got = [p.grad.clone() for p in params]
    model.zero_grad()
    sums, counts = model(**batch)
    (sum(w * sums[t] / counts[t] for t, w in enumerate(weights))).backward()
    for p, g in zip(params, got):
        torch.testing.assert_close(g, p.grad, rtol=1e-10, atol=1e-13)
    return result


class FixedMetric:
    """An AdamWPreconditioner stand-in: the same diagonal every step."""

    def __init__(self, diagonal):
        self._diagonal = diagonal

    def diagonal(self, params):
        return {p: self._diagonal[p] for p in params}


class SGDEngine(FakeEngine):
    """θ ← θ − lr·∇: the update applied is −lr·Σ_t w_t g_t exactly."""

    def __init__(self, module, lr):
        super().__init__(module)
        self.lr = lr

    @torch.no_grad()
    def step(self):
        for p in self.module.parameters():
            if p.grad is not None:
                p -= self.lr * p.grad
                p.grad = None


# objective 0 spans both tasks (as with weighting.objectives: language); 1 and 2 are task 0's
SPANNING = dict(objectives=[0, 0, 1, 1, 0, 2, 1, 0], heads=[0, 1, 0, 0, 1, 0, 0, 1], labels=[1, 2, 0, 1, 0, 1, 1, 2])
