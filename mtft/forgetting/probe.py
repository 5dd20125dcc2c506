"""The Gaussian sensitivity probe (Springer et al., 2025, eq. 1): θ̃ = θ + ε, ε ~ N(0, γ²Σ), Σ the initialisation
covariance.

Noise scale per tensor. Σ is the covariance of the initialisation distribution of each parameter, so a tensor's
noise std is γ × the std its entries are drawn with at initialisation -- the same for every checkpoint. mtft
reads that std off a fresh initialisation of the same model config by the model's own ``_init_weights`` (for
XLM-R / BERT: N(0, initializer_range) for linear and embedding weights), in a private RNG. Norm weights
(initialised to 1) and biases (initialised to 0) have a deterministic initialisation: their init variance is
zero, so by the definition they are **not** perturbed; the report counts them. For Multi-LoRA the effective
weight W0 + s·B·A is perturbed through W0 (same thing), and A, B are left alone.

Every trial perturbs in place and is undone by copying the saved weights back (never by subtracting the noise,
which would not round-trip in floating point); after the probe the weights are verified bit-identical.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean, pstdev
from typing import Callable, Sequence

import torch
from torch import nn

from mtft.forgetting.mlm import MaskedLM, lp_per_language


def init_stds(mlm: MaskedLM, fresh: nn.Module) -> dict[str, float]:
    """Per parameter of ``mlm``: the std of its initialisation, from ``fresh`` (a freshly initialised
    ``…ForMaskedLM`` of the same config). Names are matched after mapping the encoder prefix and dropping
    Multi-LoRA's ``base_layer``; parameters with no counterpart (lora_A, lora_B) get 0."""
    prefix = fresh.base_model_prefix
    head_name = next(name for name, _ in fresh.named_children() if name != prefix)
    reference = {}
    for name, param in fresh.named_parameters():
        mapped = (
            "encoder." + name[len(prefix) + 1 :]
            if name.startswith(prefix + ".")
            else "head." + name[len(head_name) + 1 :]
        )
        values = param.detach().double()
        reference[mapped] = float(values.std()) if values.numel() > 1 else 0.0
    stds = {}
    for name, _ in mlm.named_parameters():
        stds[name] = reference.get(name.replace(".base_layer.", "."), 0.0) if ".lora_" not in name else 0.0
    return stds


@dataclass
class ProbeResult:
    model: str
    baseline: dict[str, float]  # L_p per language, unperturbed
    trials: list[dict] = field(default_factory=list)  # {"gamma", "seed", "lp": {language: L_p}}
    perturbed: int = 0
    untouched: int = 0

    def summary(self) -> list[dict]:
        """Per γ: ΔL_p per language and averaged over languages -- mean, std, min, max over seeds."""
        rows = []
        for gamma in sorted({t["gamma"] for t in self.trials}):
            trials = [t for t in self.trials if t["gamma"] == gamma]
            row = {"model": self.model, "gamma": gamma, "seeds": len(trials)}
            per_language = {lang: [t["lp"][lang] - base for t in trials] for lang, base in self.baseline.items()}
            per_language["mean"] = [mean(values) for values in zip(*per_language.values())]
            for lang, deltas in per_language.items():
                row[f"dlp/{lang}/mean"] = mean(deltas)
                row[f"dlp/{lang}/std"] = pstdev(deltas)
                row[f"dlp/{lang}/min"] = min(deltas)
                row[f"dlp/{lang}/max"] = max(deltas)
            rows.append(row)
        return rows


@torch.no_grad()
def gaussian_probe(
    mlm: nn.Module,
    stds: dict[str, float],
    evaluate: Callable[[], dict[str, float]],
    gammas: Sequence[float],
    seeds: int,
    model: str = "model",
) -> ProbeResult:
    """ΔL_p under noise of std γ·σ_init for every γ and ``seeds`` noise seeds; weights restored exactly. ``mlm`` is
    any module (a :class:`MaskedLM`, or the linear network of :mod:`.linear_theory`): only its named parameters,
    ``stds`` and ``evaluate`` are used; draw ``seed`` of a γ is the same for every model of the same shapes."""
    params = {name: p for name, p in mlm.named_parameters() if stds.get(name, 0.0) > 0}
    saved = {name: p.detach().clone() for name, p in params.items()}
    result = ProbeResult(
        model,
        evaluate(),
        perturbed=sum(p.numel() for p in params.values()),
        untouched=sum(p.numel() for n, p in mlm.named_parameters() if n not in params),
    )
    try:
        for g, gamma in enumerate(gammas):
            for seed in range(seeds):
                generator = torch.Generator().manual_seed(1_000_003 * seed + g)
                for name, p in params.items():
                    noise = torch.randn(p.shape, generator=generator, dtype=torch.float32)
                    p.add_((noise * (gamma * stds[name])).to(p))
                result.trials.append({"gamma": gamma, "seed": seed, "lp": evaluate()})
                for name, p in params.items():
                    p.copy_(saved[name])
    finally:
        for name, p in params.items():
            p.copy_(saved[name])
    changed = [name for name, p in params.items() if not torch.equal(p, saved[name])]
    if changed:  # copy_ is exact; this would be a bug
        raise RuntimeError(f"probe did not restore {changed[:3]}")
    return result


def probe_lp(mlm: MaskedLM, eval_set, batch_size: int, device) -> Callable[[], dict[str, float]]:
    return lambda: lp_per_language(mlm, eval_set, batch_size, device)


def write_probe_json(path: Path, results: Sequence[ProbeResult]) -> None:
    """``probe.json``: every probed model's baseline L_p, trials, per-γ summary and the parameters perturbed -- the
    file a run's end-of-run probe and ``run.py probe`` both write."""
    rows = [
        {
            "model": r.model,
            "baseline": r.baseline,
            "trials": r.trials,
            "summary": r.summary(),
            "perturbed_parameters": r.perturbed,
            "untouched_parameters": r.untouched,
        }
        for r in results
    ]
    Path(path).write_text(json.dumps(rows, indent=2) + "\n")
