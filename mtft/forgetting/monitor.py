"""The Theorem-1 monitor of a fine-tuning run (Mao et al., 2022, "Less-forgetting multi-lingual fine-tuning";
Springer et al., 2025, "Overtrained language models are harder to fine-tune").

Every step, from the actual update: K, Σ_k ||Δθ_k||², ||θ − θ_p||², and the displacement and path bounds
(λ_p/2)·||θ − θ_p||² and (λ_p/2)·K·Σ||Δθ_k||² (cheap: norms of the tensors fine-tuning moves). Every
``forgetting.every_steps`` and at the end: the measured forgetting F_p = L_p(θ) − L_p(θ_p) per language on the
held-out corpus, and on a fixed (smaller) batch the second-order prediction g_pᵀΔ + ½ΔᵀH_pΔ (one
Hessian-vector product at θ_p), so that a measured F_p above the bound can be told apart: θ_p not a minimum
(the linear term) or the quadratic regime broken down (measured far above the prediction). With
``forgetting.retrieval``, the same measurements (and θ_p) also give cross-lingual sentence retrieval accuracy per
language pair (:mod:`mtft.forgetting.retrieval`): the cross-lingual knowledge L_p does not see.

λ_p is computed once per (θ_p, batch, settings) and cached beside the backbone when it is a local folder (the
pre-trained checkpoint it belongs to), otherwise in the cache dir. With Multi-LoRA every task adapter is its own
model θ_i = W0 + s·B_i·A: F_p, distances and bounds are reported per task, λ_p is taken over the adapted layers'
weights (the only ones the adapters move; a principal block of the full Hessian, so never larger than the full
λ_p and still a valid bound for these displacements).

All ranks compute the same numbers (they hold the same weights); rank 0 logs and writes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Protocol, Union

import torch

from mtft.adapters import build_method
from mtft.config.paths import cache_dir
from mtft.config.schema import (
    ContrastiveSection,
    CorpusSection,
    DataSection,
    ForgettingSection,
    HeadFitSection,
    ModelSection,
)
from mtft.core.errors import ConfigError
from mtft.core.runlock import waiting_lock
from mtft.forgetting.contrastive import ContrastiveLp, ParallelEvalSet, build_parallel_eval_set
from mtft.forgetting.corpus import MlmEvalSet, build_eval_set, corpus_languages
from mtft.forgetting.head_fit import fitted_head
from mtft.forgetting.hessian import EigenResult, LpObjective, top_eigenvalue
from mtft.forgetting.mlm import (
    EncoderLoss,
    attach_head,
    eager_attention,
    evaluating,
    load_mlm_checkpoint,
    load_mlm_model,
    lp_per_language,
    lp_sums,
)
from mtft.forgetting.probe import gaussian_probe, init_stds, probe_lp, write_probe_json
from mtft.forgetting.replica import EncoderReplica
from mtft.forgetting.retrieval import RetrievalSet, build_retrieval_set
from mtft.models.named_backbones import local_backbone
from mtft.reporting.logs import logger

LAMBDA_VERSION = "2"  # 2: Lanczos restarted by mtft itself, within the product budget (was ARPACK)
FRESH_HEAD = "a freshly initialised masked-LM head (the tiny encoder is not pre-trained here)"


@dataclass(frozen=True)
class MonitorSettings:
    """What the monitors read of a run's configuration, and nothing more (the run's builder fills it)."""

    forgetting: ForgettingSection
    corpus: CorpusSection  # the generic text L_p is measured on
    data: DataSection  # the corpus's sources and max_length; the cache folder λ_p falls back to
    log_every: int  # logging.every_steps: the period of the "displacement" rows
    replicate: bool  # the weights are sharded (ZeRO-3): the monitors measure a whole replica of the encoder
    pretrained_on_corpus: bool  # pretrain.before_finetune: the backbone was pre-trained on the corpus by this run


@dataclass
class ForgettingSetup:
    """What the monitors need that can fail on bad input, prepared before the run directory is written."""

    settings: MonitorSettings
    eval_set: Union[MlmEvalSet, ParallelEvalSet]
    model: ModelSection  # config.model with its backbone resolved (pre-trained by the prelude, re-trained by SURT)
    mlm_model: Optional[torch.nn.Module] = None  # the backbone as a masked-LM (None: a fresh head on the encoder)
    lp_head: str = FRESH_HEAD  # how L_p's masked-LM head was obtained, for the log and the report
    retrieval: Optional[RetrievalSet] = None  # forgetting.retrieval's parallel sentences, tokenised


def prepare_forgetting(settings: MonitorSettings, model: ModelSection, data) -> Optional[ForgettingSetup]:
    """Load the monitors' corpus and masked-LM head for fine-tuning ``model`` (the backbone it starts from) on
    ``data`` (what the DeepSpeed configuration rules out was refused by
    :func:`mtft.config.deepspeed.check_forgetting` before DeepSpeed started); ``None`` when they are off."""
    cfg, corpus = settings.forgetting, settings.corpus
    if not cfg.enabled:
        return None
    off = build_method(model.adapter).monitors_off
    if off is not None:
        logger.info(f"forgetting monitors: model.adapter.method={model.adapter.method} {off}; monitors off")
        return None
    if model.backbone != "tiny" and corpus.path is None and not settings.pretrained_on_corpus:
        logger.warning(
            "forgetting monitors: corpus.path is not set, so L_p is measured on the built-in "
            "synthetic corpus; set corpus.path to generic text in your backbone's languages"
        )
    languages = corpus_languages(corpus, [lang for td in data.tasks.values() for lang in td.languages])
    eval_set: Union[MlmEvalSet, ParallelEvalSet]
    if cfg.lp == "contrastive":
        eval_set = build_parallel_eval_set(
            cfg.contrastive, corpus, settings.data, data.tokenizer, languages, settings.data.max_length
        )
    else:
        eval_set = build_eval_set(corpus, settings.data, data.tokenizer, languages, settings.data.max_length)
    check_fixed_batches(cfg, corpus, eval_set)
    retrieval = (
        build_retrieval_set(cfg, corpus, settings.data, data.tokenizer, languages) if cfg.retrieval.enabled else None
    )
    if cfg.lp == "contrastive":
        mlm_model, lp_head = None, contrastive_description(cfg.contrastive, eval_set.pivot)
    else:
        mlm_model, lp_head = masked_lm_for_lp(model, data.tokenizer, cfg.head_fit, corpus, settings.data, languages)
    if retrieval is not None and cfg.retrieval.layer is not None:
        layers = encoder_layers(model, mlm_model)
        if cfg.retrieval.layer > layers:
            raise ConfigError(
                f"forgetting.retrieval.layer={cfg.retrieval.layer}: the encoder has {layers} layers (0 is the "
                "embeddings)"
            )
    return ForgettingSetup(settings, eval_set, model, mlm_model, lp_head, retrieval)


def contrastive_description(cfg: ContrastiveSection, pivot: str) -> str:
    return (
        f"the encoder's own contrastive loss (InfoNCE, τ = {cfg.temperature:g}, in-batch negatives; "
        f"{cfg.query_prefix.strip()!r} + each language's sentence against {cfg.passage_prefix.strip()!r} + the "
        f"{pivot} translations)"
    )


def encoder_layers(model: ModelSection, mlm_model) -> int:
    if mlm_model is not None:
        return mlm_model.config.num_hidden_layers
    if model.backbone == "tiny":
        return model.tiny.num_hidden_layers
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(local_backbone(model.backbone), revision=model.revision).num_hidden_layers


def check_fixed_batches(
    forgetting: ForgettingSection, corpus: CorpusSection, eval_set: Union[MlmEvalSet, ParallelEvalSet]
) -> None:
    """λ_p and the second-order prediction average the masked-LM loss over each language's first N held-out texts
    (forgetting.hessian_examples, forgetting.prediction_examples); the masks are drawn at random, so a few short
    texts can hold no masked token, and that language's mean loss would be 0/0. Refused, naming the fewest that do.
    """
    fewest = {language: eval_set.fewest_masked(language) for language in eval_set.languages}
    worst = max(fewest, key=fewest.__getitem__)
    for setting in ("hessian_examples", "prediction_examples"):
        value = getattr(forgetting, setting)
        if value < fewest[worst]:
            raise ConfigError(
                f"forgetting.{setting}={value}: the first {value} held-out text(s) of corpus language {worst!r} "
                f"hold no masked token (corpus.mlm_probability={corpus.mlm_probability:g}); set "
                f"forgetting.{setting} to at least {fewest[worst]}"
            )


def masked_lm_for_lp(
    model: ModelSection,
    tokenizer,
    head_fit: HeadFitSection,
    corpus: CorpusSection,
    data: DataSection,
    languages,
) -> tuple[Optional[Any], str]:
    """The backbone as a masked-LM and how its head was obtained: the checkpoint's own, fitted to θ_p when the
    checkpoint has none (:mod:`mtft.forgetting.head_fit`: by ``head_fit``, the run's ``forgetting.head_fit``, on
    ``corpus``'s texts, read through ``data.sources`` and cached under ``data.cache_dir``), or fresh on the
    untrained tiny encoder."""
    if model.backbone == "tiny":
        return None, FRESH_HEAD
    mlm_model, head_missing = load_mlm_checkpoint(model.backbone, model.revision, model.trust_remote_code)
    if not head_missing:
        return mlm_model, f"the masked-LM head of the checkpoint {model.backbone}"
    return mlm_model, fitted_head(mlm_model, tokenizer, head_fit, corpus, data, languages, model.backbone)


def budget_alpha(previous: float, update: float, new: float, radius_sq: float) -> float:
    """Largest α ∈ [0, 1] with ||D + α·Δ||² ≤ radius², where D = θ_k − θ_p (||D||² = ``previous``), Δ the
    step's update (||Δ||² = ``update``) and ||D + Δ||² = ``new``; ⟨D, Δ⟩ follows from the three norms."""
    if previous >= radius_sq:
        return 0.0
    if update <= 0 or new <= radius_sq:
        return 1.0
    cross = 0.5 * (new - previous - update)
    disc = cross * cross - update * (previous - radius_sq)
    return min(1.0, max(0.0, (-cross + math.sqrt(max(disc, 0.0))) / update))


def _key(name: str, group: str, language: str = "") -> str:
    """name[/group][/language]: group is "" for full fine-tuning, a task for Multi-LoRA."""
    return "/".join(part for part in (name, group, language) if part)


class Monitor(Protocol):
    """What the training loop calls of the forgetting monitors: :class:`ForgettingMonitor`, or :class:`NullMonitor`
    when they are off."""

    def start(self, step: int, log: Any) -> None: ...
    def after_step(self, step: int) -> Optional[str]: ...
    def end(self, step: int) -> None: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: Optional[dict]) -> None: ...


class NullMonitor:
    """Monitors off: every hook does nothing (a :class:`Monitor`)."""

    def start(self, step: int, log: Any) -> None: ...
    def after_step(self, step: int) -> Optional[str]:
        return None

    def end(self, step: int) -> None: ...
    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Optional[dict]) -> None: ...


class ForgettingMonitor:
    """The monitors of one run (a :class:`Monitor`): ``setup`` is what :func:`prepare_forgetting` loaded and the
    settings it was given; ``engine`` the DeepSpeed engine around the multi-task model; ``data`` the prepared data
    (its head tasks and objectives name the adapter groups); rank 0 (``is_main``) writes ``run_dir/probe.json``."""

    def __init__(self, setup: ForgettingSetup, engine, data, is_main: bool, run_dir: Path):
        self.settings, self.cfg = setup.settings, setup.settings.forgetting
        self.engine, self.is_main, self.run_dir = engine, is_main, run_dir
        self.eval_set = setup.eval_set
        self.retrieval = setup.retrieval
        self.retrieval_pretrained: dict[str, float] = {}
        self.device = engine.device
        model = setup.model
        self.backbone = model.backbone
        encoder = engine.module.encoder
        # under ZeRO-3 the monitors measure a whole copy, refreshed after every step (mtft.forgetting.replica)
        self.replica = EncoderReplica(encoder) if self.settings.replicate else None
        if self.replica is not None:
            encoder = self.replica.module
            logger.info(
                "forgetting monitors under ZeRO-3: a whole replica of the encoder "
                f"({sum(p.numel() for p in encoder.parameters()):,} parameters) on each rank, its "
                f"{sum(p.numel() for p in self.replica.target):,} trainable ones refreshed after every step"
            )
        self.lp_head = setup.lp_head
        self.mlm: EncoderLoss
        if self.cfg.lp == "contrastive":  # the encoder's own pre-training loss needs no head
            self.mlm_model, self.fresh_config = None, encoder.config
            self.mlm = ContrastiveLp(encoder, self.cfg.contrastive.temperature)
        else:
            self.mlm_model = setup.mlm_model
            if self.mlm_model is None:
                self.mlm_model = load_mlm_model(model.backbone, model.revision, model.trust_remote_code, encoder.config)
            self.mlm, self.fresh_config = attach_head(encoder, self.mlm_model), self.mlm_model.config
        self.tracker = build_method(model.adapter).tracker(encoder, data.head_tasks(), data.objective_names)
        self.groups = self.tracker.groups
        names, fixed = self.tracker.hessian_subset()

        def batches(limit):
            return {lang: self.eval_set.batches(lang, self.cfg.batch_size, limit) for lang in self.eval_set.languages}

        # λ_p once (cached) on a larger batch; the second-order prediction every measurement on a smaller one
        self.eigen_objective = LpObjective(self.mlm, names, batches(self.cfg.hessian_examples), self.device, fixed)
        self.prediction_batches = batches(self.cfg.prediction_examples)
        self.objective = LpObjective(self.mlm, names, self.prediction_batches, self.device, fixed)
        self.handles = []
        if self.cfg.regularization > 0:
            self.handles = self.tracker.regularize(self.cfg.regularization, engine.gradient_accumulation_steps())
        self.steps = 0  # K
        self.sum_update_sq = [0.0] * len(self.groups)
        self.distance_sq = [0.0] * len(self.groups)
        self.last_evaluated: Optional[int] = None  # the step of the last "forgetting" row
        self.ended: Optional[int] = None  # the step end() logged the final row and the probe at
        self.eigen: Optional[EigenResult] = None

    # ---------------------------------------------------------------------------------------------
    @property
    def lambda_p(self) -> float:
        return self.eigen.value

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: the path sums, and which rows of metrics.jsonl it already holds (the last
        measurement's step, the step end() ran at), so that a resume does not log them again."""
        return {
            "steps": self.steps,
            "sum_update_sq": self.sum_update_sq,
            "distance_sq": self.distance_sq,
            "last_evaluated": self.last_evaluated,
            "ended": self.ended,
        }

    def load_state_dict(self, state: Optional[dict]) -> None:
        if state:
            self.steps = int(state["steps"])
            self.sum_update_sq = [float(v) for v in state["sum_update_sq"]]
            self.distance_sq = [float(v) for v in state["distance_sq"]]
            self.last_evaluated = state.get("last_evaluated")  # absent from checkpoints before it was kept
            self.ended = state.get("ended")

    def start(self, step: int, log) -> None:
        """L_p(θ_p) and λ_p (cached), once; the trackers synchronised with the current weights."""
        self.log = log
        self._refresh()
        self.tracker.advance()
        with self.tracker.at_pretrained():
            self.lp_pretrained = self._lp_group(0)  # at θ_p every task adapter is the same model
            self.lp_batch_pretrained = self._lp_batch()
            self.retrieval_pretrained = self._retrieval_group(0)
            start = time.perf_counter()
            self.eigen, cached = self._lambda_p()
        values = {
            "lambda_p": self.lambda_p,
            **{f"eigen_{k}": v for k, v in self.eigen.as_dict().items() if k != "history"},
            "cached": cached,
            "seconds": time.perf_counter() - start,
            "parameters": sum(self.objective_point()[n].numel() for n in self.objective.names),
            "hessian_examples_per_language": self.cfg.hessian_examples,
            "prediction_examples_per_language": self.cfg.prediction_examples,
            "lp_batch_pretrained": self.lp_batch_pretrained,
            "lp": self.cfg.lp,
            "lp_head": self.lp_head,
            **{f"lp_pretrained/{lang}": v for lang, v in self.lp_pretrained.items()},
            **{k.replace("retrieval", "retrieval_pretrained", 1): v for k, v in self.retrieval_pretrained.items()},
        }
        if step == 0:  # a resumed run keeps the event its first attempt logged
            log.log(step, "lambda_p", values)
        state = "converged" if self.eigen.converged else "NOT converged"
        logger.info(
            f"forgetting: λ_p = {self.lambda_p:.6g} ({self.eigen.method}, {self.eigen.products} Hessian-vector "
            f"products, residual {self.eigen.residual:.2e}, {state}{', cached' if cached else ''}); "
            f"L_p(θ_p) = " + ", ".join(f"{k} {v:.4f}" for k, v in self.lp_pretrained.items())
        )

    def objective_point(self) -> dict[str, torch.Tensor]:
        return self.tracker.pretrained_point()

    # ---------------------------------------------------------------------------------------------
    def after_step(self, step: int) -> Optional[str]:
        """Track the update just applied; returns a reason to stop (forgetting budget) or None."""
        self._refresh()
        update_sq, distance_sq = self.tracker.measure()
        stop = None
        budget = self.cfg.budget
        if budget is not None:
            bounds = [0.5 * self.lambda_p * d for d in distance_sq]
            if any(b > budget.value for b in bounds):
                if budget.action == "stop":
                    stop = "forgetting_budget"
                else:
                    alphas = [
                        budget_alpha(prev, upd, new, 2.0 * budget.value / self.lambda_p) if b > budget.value else 1.0
                        for prev, upd, new, b in zip(self.distance_sq, update_sq, distance_sq, bounds)
                    ]
                    self.tracker.scale_update(alphas)
                    update_sq, distance_sq = self.tracker.measure()
                    self.log.log(step, "budget", {_key("alpha", g): a for g, a in zip(self.groups, alphas)})
        self.tracker.advance()
        self.steps += 1
        self.sum_update_sq = [s + u for s, u in zip(self.sum_update_sq, update_sq)]
        self.distance_sq = distance_sq
        if step % self.settings.log_every == 0 or stop:
            self.log.log(step, "displacement", self._displacement_values())
        if step % self.cfg.every_steps == 0:
            self.evaluate(step)
        return stop

    def _refresh(self) -> None:
        """Under ZeRO-3, the replica's trainable weights ← the engine's (every rank gathers)."""
        if self.replica is not None:
            self.replica.refresh()

    def _displacement_values(self) -> dict[str, Any]:
        values: dict[str, Any] = {"K": self.steps}
        for g, group in enumerate(self.groups):
            values[_key("sum_update_sq", group)] = self.sum_update_sq[g]
            values[_key("distance", group)] = math.sqrt(self.distance_sq[g])
            values[_key("bound_displacement", group)] = 0.5 * self.lambda_p * self.distance_sq[g]
            values[_key("bound_path", group)] = 0.5 * self.lambda_p * self.steps * self.sum_update_sq[g]
            if self.cfg.regularization:
                values[_key("regularization", group)] = self.cfg.regularization * self.distance_sq[g]
        return values

    # ---------------------------------------------------------------------------------------------
    def _lp_group(self, group: int) -> dict[str, float]:
        with self.mlm.routed_to(self.tracker.adapter(group)):
            return lp_per_language(self.mlm, self.eval_set, self.cfg.batch_size, self.device, shard=True)

    def _retrieval_group(self, group: int) -> dict[str, float]:
        """Retrieval accuracy per pair and its mean, through ``group``'s adapter ({} when retrieval is off)."""
        if self.retrieval is None:
            return {}
        mlm = self.mlm
        with mlm.routed_to(self.tracker.adapter(group)), evaluating(mlm), eager_attention(mlm.encoder):
            layer = self.cfg.retrieval.layer
            return self.retrieval.accuracy(lambda batch: mlm.hidden(**batch, layer=layer), self.device)

    def _lp_batch(self) -> float:
        """L_p on the fixed prediction batch: mean over languages of each language's mean (as LpObjective)."""
        means = []
        for batches in self.prediction_batches.values():
            total, count = lp_sums(self.mlm, batches, self.device, shard=True)
            means.append(total / count)
        return sum(means) / len(means)

    def evaluate(self, step: int) -> None:
        start = time.perf_counter()
        values = self._displacement_values()
        point = self.objective_point()
        for g, group in enumerate(self.groups):
            lp = self._lp_group(g)
            forgetting = {lang: lp[lang] - self.lp_pretrained[lang] for lang in lp}
            mean_forgetting = sum(forgetting.values()) / len(forgetting)
            with self.mlm.routed_to(self.tracker.adapter(g)):
                batch_forgetting = self._lp_batch() - self.lp_batch_pretrained
            second = self.objective.second_order(point, self.tracker.delta(g, self.objective.names))
            for lang in lp:
                values[_key("lp", group, lang)] = lp[lang]
                values[_key("F_p", group, lang)] = forgetting[lang]
            retrieval = self._retrieval_group(g)
            for name, value in retrieval.items():
                pair = name.partition("/")[2]
                values[_key("retrieval", group, pair)] = value
            if retrieval:  # the fall of the mean accuracy since θ_p
                values[_key("retrieval_drop", group)] = self.retrieval_pretrained["retrieval"] - retrieval["retrieval"]
            bound = values[_key("bound_displacement", group)]
            values.update(
                {
                    _key("F_p", group): mean_forgetting,
                    _key("F_batch", group): batch_forgetting,
                    _key("prediction", group): second["prediction"],
                    _key("linear", group): second["linear"],
                    _key("quadratic", group): second["quadratic"],
                    _key("exceeds_bound", group): int(mean_forgetting > bound),
                }
            )
            if mean_forgetting > bound:
                logger.warning(
                    f"step {step}: measured forgetting{' of ' + group if group else ''} "
                    f"F_p = {mean_forgetting:.4g} exceeds the Theorem-1 bound {bound:.4g}"
                )
        values["seconds"] = time.perf_counter() - start  # what the measurement cost (bench/forgetting_overhead.py)
        self.log.log(step, "forgetting", values)
        self.last_evaluated = step

    # ---------------------------------------------------------------------------------------------
    def end(self, step: int) -> None:
        """The final measurement (if the last step was not one), and the end-of-run probe (rank 0). Once per run:
        the run saves its checkpoint after this, so a resume of the finished run (its checkpoint says ``ended``)
        finds the final row and the probe's rows in metrics.jsonl, and probe.json written, already."""
        done, self.ended = self.ended == step, step
        if not done and self.last_evaluated != step:
            self.evaluate(step)
        for handle in self.handles:
            handle.remove()
        probe = self.cfg.probe
        if done or not probe.gammas or not self.is_main:
            return
        start = time.perf_counter()
        stds = init_stds(self.mlm, self._fresh_model())
        evaluate = probe_lp(self.mlm, self.eval_set, self.cfg.batch_size, self.device)
        results = []
        if probe.include_pretrained:
            with self.tracker.at_pretrained():
                results.append(gaussian_probe(self.mlm, stds, evaluate, probe.gammas, probe.seeds, "pre-trained"))
        for g, group in enumerate(self.groups):
            with self.mlm.routed_to(self.tracker.adapter(g)):
                name = f"fine-tuned/{group}" if group else "fine-tuned"
                results.append(gaussian_probe(self.mlm, stds, evaluate, probe.gammas, probe.seeds, name))
        for result in results:
            for row in result.summary():
                self.log.log(step, "probe", {**row, "perturbed": result.perturbed, "untouched": result.untouched})
        logger.info(
            f"sensitivity probe: {len(results)} model(s) × {len(probe.gammas)} γ × {probe.seeds} seeds in "
            f"{time.perf_counter() - start:.1f} s -> probe.json"
        )
        write_probe_json(self.run_dir / "probe.json", results)

    def _fresh_model(self):
        """A freshly initialised masked-LM of the encoder's config: the probe's initialisation scales (its head's
        are used only when L_p has a head)."""
        return load_mlm_model("tiny", None, False, self.fresh_config)

    # ---------------------------------------------------------------------------------------------
    def _lambda_p(self) -> tuple[EigenResult, bool]:
        """λ_p from the cache, or by power iteration / Lanczos at θ_p (the caller holds θ_p in place). Runs started
        together on one θ_p (the cells of a study's seed) compute it once: the first holds the entry's lock, the
        others wait for it and read what it wrote."""
        path = self._cache_path(self._cache_key())
        lock = path.with_name(f".{path.name}.lock")
        waiting = waiting_lock(lock, lambda: logger.info(f"λ_p: waiting for another run computing it ({path})"))
        with waiting if self.is_main else contextlib.nullcontext():
            return self._lambda_p_at(path)

    def _lambda_p_at(self, path: Path) -> tuple[EigenResult, bool]:
        distributed = torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1
        cached = torch.tensor([float(path.is_file())], device=self.device)
        if distributed:  # every rank takes the same branch, or the broadcast below would wait forever
            torch.distributed.all_reduce(cached, op=torch.distributed.ReduceOp.MIN)
        if bool(cached.item()):
            data = json.loads(path.read_text())
            return EigenResult(**data["eigen"]), True
        point = self.objective_point()
        start_vector = self.eigen_objective.random_vector(point, seed=0)
        result = top_eigenvalue(
            lambda v: self.eigen_objective.hvp(point, v)[2],
            start_vector,
            self.cfg.eigen_method,
            self.cfg.eigen_iterations,
            self.cfg.eigen_tol,
        )
        if distributed:
            value = torch.tensor([result.value], dtype=torch.float64, device=self.device)
            torch.distributed.broadcast(value, src=0)  # one λ_p for every rank's budget decisions
            result.value = float(value)
        if self.is_main:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
            tmp.write_text(json.dumps({"backbone": self.backbone, "eigen": result.as_dict()}, indent=2) + "\n")
            os.replace(tmp, path)
        return result, False

    def _cache_key(self) -> str:
        digest = hashlib.sha256(
            f"lambda-v{LAMBDA_VERSION}|{self.cfg.eigen_method}|{self.cfg.eigen_iterations}|"
            f"{self.cfg.eigen_tol}|{self.cfg.hessian_examples}|{self.objective.names}|"
            f"{sorted(self.objective.fixed)}|{self.eval_set.digest()}".encode()
        )
        for name, param in self.mlm.named_parameters():  # θ_p itself (the caller holds it in place)
            if ".lora_" in name:
                # at θ_p every B is zero, so the adapters add nothing and the function -- the Hessian with it -- is
                # W0's whatever A is: A (drawn by run.seed) would give every seed of a study a λ_p of its own
                continue
            digest.update(name.encode())
            digest.update(param.detach().float().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        return digest.hexdigest()[:24]

    def _cache_path(self, key: str) -> Path:
        folder = Path(self.backbone)
        if folder.is_dir() and os.access(folder, os.W_OK):
            return folder / "lambda_p" / f"{key}.json"
        return cache_dir(self.settings.data) / "lambda_p" / f"{key}.json"
