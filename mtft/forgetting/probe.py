"""The Gaussian sensitivity probe (Springer et al., 2025, eq. 1): θ̃ = θ + ε, ε ~ N(0, γ²Σ), Σ the initialisation
covariance.

Noise scale per tensor. Σ is the covariance of the initialisation distribution of each parameter, so a tensor's
noise std is γ × σ_init, the std its entries are drawn with at initialisation -- the same for every checkpoint
(:func:`init_stds`). σ_init is the initialiser's own σ where the scheme is known: the model families in
:data:`NORMAL_INIT` draw every ``nn.Linear`` and ``nn.Embedding`` weight from N(0, ``initializer_range``)
(transformers' default ``_init_weights``), tied or not, whichever name the weight is reached by. Every other
parameter falls back to the std of its entries in a fresh initialisation of the same config by the model's own
``_init_weights`` (in a private RNG): 0 for a tensor initialised to a constant -- norm weights (ones) and biases
(zeros) -- whose init variance is zero, so by eq. 1 they are **not** perturbed; the report counts them. For
Multi-LoRA and LoRA the effective weight W0 + s·B·A is perturbed through W0 (same thing), and A, B are left alone.

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

from mtft.core.atomic import write_text
from mtft.forgetting.mlm import EncoderLoss, lp_per_language

#: ``model_type`` of the families whose ``_init_weights`` is transformers' default for linear and embedding weights,
#: N(0, config.initializer_range) (checked against transformers 5's source); others use the fallback of
#: :func:`init_stds`.
NORMAL_INIT = frozenset({"xlm-roberta", "xlm-roberta-xl", "roberta", "camembert", "bert", "electra", "mpnet"})


def init_stds(mlm: EncoderLoss, fresh: nn.Module) -> dict[str, float]:
    """σ_init of every parameter of ``mlm``, under each name it is reached by (a tied weight has two), from
    ``fresh``, a freshly initialised ``…ForMaskedLM`` of the same config. Names are matched after mapping the
    encoder prefix and dropping (Multi-)LoRA's ``base_layer``; the adapters' own A and B get 0.

    σ_init is ``initializer_range`` for linear and embedding weights of a :data:`NORMAL_INIT` family; for anything
    else, the fallback is the std of the fresh tensor's entries (0 for a constant: norm weights, biases). Any other
    parameter without a counterpart in ``fresh`` would go unperturbed for no reason: an error."""
    reference = _fresh_stds(fresh)
    prefix = fresh.base_model_prefix
    head_name = next(name for name, _ in fresh.named_children() if name != prefix)
    parts = {"encoder": prefix, "head": head_name}  # MaskedLM's module names -> the …ForMaskedLM's
    stds, missing = {}, []
    for name, _ in mlm.named_parameters(remove_duplicate=False):
        if ".lora_" in name:
            stds[name] = 0.0
            continue
        plain = name.replace(".base_layer.", ".")
        part, _, rest = plain.partition(".")
        mapped = f"{parts.get(part)}.{rest}"
        if mapped not in reference:
            missing.append(name)
        stds[name] = reference.get(mapped, 0.0)
    if missing:
        raise RuntimeError(f"probe: no initialisation known for {len(missing)} parameter(s): {', '.join(missing[:3])}")
    return stds


def _fresh_stds(fresh: nn.Module) -> dict[str, float]:
    """σ_init by every name of every parameter of ``fresh`` (tied aliases included)."""
    config = fresh.config
    known = getattr(config, "model_type", None) in NORMAL_INIT
    sigma = getattr(config, "initializer_range", None) or 0.02  # transformers' own default when unset
    stds = {}
    for module_name, module in fresh.named_modules(remove_duplicate=False):
        for local, param in module.named_parameters(recurse=False, remove_duplicate=False):
            name = f"{module_name}.{local}" if module_name else local
            if known and local == "weight" and isinstance(module, (nn.Linear, nn.Embedding)):
                stds[name] = float(sigma)
            else:
                values = param.detach().double()
                stds[name] = float(values.std()) if values.numel() > 1 else 0.0
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


def probe_lp(mlm: EncoderLoss, eval_set, batch_size: int, device) -> Callable[[], dict[str, float]]:
    return lambda: lp_per_language(mlm, eval_set, batch_size, device)


def write_probe_json(path: Path, results: Sequence[ProbeResult]) -> None:
    """``probe.json`` (:func:`probe_json`), replaced in one rename."""
    write_text(path, probe_json(results))


def probe_json(results: Sequence[ProbeResult]) -> str:
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
    return json.dumps(rows, indent=2) + "\n"
