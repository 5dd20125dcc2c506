"""The masked-LM loss L_p of an encoder: the fine-tuned encoder under a masked-LM head that fine-tuning never trains.

The head is the backbone's own pre-trained one (``AutoModelForMaskedLM`` of the checkpoint: XLM-R's ``lm_head``,
BERT's ``cls``), a freshly initialised one for the untrained ``tiny`` encoder, or -- for a checkpoint that ships
no masked-LM head, such as sentence-transformers' all-MiniLM-L6-v2 -- a head fitted once to the frozen θ_p
(:mod:`mtft.forgetting.head_fit`). Where the backbone ties its output embedding to the input embedding (XLM-R,
BERT), the head's decoder is re-tied to the *fine-tuned* encoder's embedding, exactly as the fine-tuned model would
be saved and reloaded as a masked-LM.

Logits are computed only at the masked positions (the head is position-wise): with XLM-R's 250k-token
vocabulary, logits at every position would cost gigabytes, and double backward through them more.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch
from torch import nn
from transformers import AutoModelForMaskedLM, PretrainedConfig

from mtft.core.errors import ConfigError
from mtft.core.labels import IGNORE_INDEX
from mtft.core.rows import labelled_rows
from mtft.core.shards import sharded_map
from mtft.models.folders import LOAD_ERRORS, check_backbone_code, first_line
from mtft.models.loading import listing, load_pretrained, modules
from mtft.models.named_backbones import local_backbone
from mtft.reporting.logs import logger


class EncoderLoss(nn.Module):
    """A pre-training loss L_p of ``encoder`` (shared, not copied): ``forward(**batch)`` returns (loss sum, number of
    targets), :meth:`targets` counts a batch's targets without running it. Every row is routed to one task adapter
    (Multi-LoRA), :attr:`adapter`. The masked-LM loss here, e5's contrastive loss in
    :mod:`mtft.forgetting.contrastive`."""

    def __init__(self, encoder: nn.Module):
        super().__init__()
        self.encoder = encoder
        self.adapter = 0  # the task adapter (Multi-LoRA) that every row is routed to

    def targets(self, batch: dict[str, torch.Tensor]) -> int:
        raise NotImplementedError

    def hidden(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, layer: Optional[int] = None
    ) -> torch.Tensor:
        """The encoder's hidden states (the last layer's, or ``layer``'s: 0 the embeddings), every row routed to
        ``self.adapter``."""
        task = torch.full((input_ids.shape[0],), self.adapter, dtype=torch.long, device=input_ids.device)
        # adapters route by the declared task, or by objective with model.adapter.granularity: objective
        with labelled_rows(task=task, objective=task):
            out = self.encoder(
                input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=layer is not None
            )
        return out.last_hidden_state if layer is None else out.hidden_states[layer]

    @contextlib.contextmanager
    def routed_to(self, adapter: int) -> Iterator[None]:
        previous, self.adapter = self.adapter, adapter
        try:
            yield
        finally:
            self.adapter = previous


class MaskedLM(EncoderLoss):
    """``encoder`` + MLM ``head``. ``forward`` returns (loss sum, masked-token count)."""

    def __init__(self, encoder: nn.Module, head: nn.Module, tied_output: Optional[nn.Module] = None):
        super().__init__(encoder)
        self.head = head
        if tied_output is not None:
            tied_output.weight = encoder.get_input_embeddings().weight

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.hidden(input_ids, attention_mask)
        targets = labels != IGNORE_INDEX
        logits = self.head(hidden[targets])
        loss = nn.functional.cross_entropy(logits.float(), labels[targets], reduction="sum")
        return loss, targets.sum()

    def targets(self, batch: dict[str, torch.Tensor]) -> int:
        return int((batch["labels"] != IGNORE_INDEX).sum())


def split_mlm_model(mlm: nn.Module) -> tuple[nn.Module, nn.Module, Optional[nn.Module]]:
    """(base encoder, head, output embedding to re-tie or None) of a ``…ForMaskedLM`` model."""
    prefix = mlm.base_model_prefix
    heads = [module for name, module in mlm.named_children() if name != prefix]
    if len(heads) != 1:
        raise ConfigError(
            f"{type(mlm).__name__} has {len(heads)} modules besides its encoder; mtft needs one "
            "masked-LM head module (as XLM-R's lm_head or BERT's cls)"
        )
    output, inputs = mlm.get_output_embeddings(), mlm.get_input_embeddings()
    tied = output is not None and output.weight is inputs.weight
    return getattr(mlm, prefix), heads[0], output if tied else None


def load_mlm_model(
    backbone: str, revision: Optional[str], trust_remote_code: bool, config: Optional[PretrainedConfig] = None
) -> nn.Module:
    """The backbone as a masked-LM: built from ``config`` (the tiny encoder; a fresh head), or from the Hub or a
    folder, where a head the checkpoint lacks is initialised at random (pre-training trains it; the monitors
    use :func:`load_mlm_checkpoint` instead and fit one)."""
    if config is not None:
        with torch.random.fork_rng(devices=[]):  # a fresh head must not move the run's RNG
            torch.manual_seed(0)
            return AutoModelForMaskedLM.from_config(config)
    model, head_missing = load_mlm_checkpoint(backbone, revision, trust_remote_code)
    if head_missing:
        logger.info(f"model.backbone={backbone}: no masked-LM head in the checkpoint; a new one is initialised")
    return model


def load_mlm_checkpoint(backbone: str, revision: Optional[str], trust_remote_code: bool) -> tuple[nn.Module, list[str]]:
    """(the checkpoint as a masked-LM, the head parameters it lacked). Checkpoint modules a masked-LM does not use
    (a pooler, a next-sentence head) are ignored in one log line; encoder weights it lacks are a warning."""
    source = local_backbone(backbone)
    check_backbone_code(source, trust_remote_code)
    try:
        with torch.random.fork_rng(devices=[]):  # initialising what the checkpoint lacks must not move the run's RNG
            model, info = load_pretrained(
                AutoModelForMaskedLM, source, revision=revision, trust_remote_code=trust_remote_code
            )
    except LOAD_ERRORS as exc:
        first = first_line(exc)
        raise ConfigError(f"cannot load the masked-LM head of model.backbone={backbone!r}: {first}") from None
    prefix = model.base_model_prefix
    lacking = info.missing | info.mismatched
    encoder = sorted(k for k in lacking if k.split(".")[0] == prefix)
    if info.unexpected:
        logger.info(
            f"model.backbone={backbone}: {', '.join(modules(info.unexpected, prefix))} of the checkpoint ignored "
            "(not part of a masked-LM)"
        )
    if encoder:
        logger.warning(
            f"model.backbone={backbone}: {len(encoder)} encoder weight(s) of the masked-LM not in the checkpoint "
            f"(or of another shape), initialised at random: {listing(encoder)}"
        )
    return model, sorted(k for k in lacking if k.split(".")[0] != prefix)


def attach_head(encoder: nn.Module, mlm: nn.Module) -> MaskedLM:
    """The fine-tuned ``encoder`` under the head of ``mlm`` (whose own encoder is dropped)."""
    _, head, tied = split_mlm_model(mlm)
    param = next(encoder.parameters())
    head.to(device=param.device, dtype=param.dtype).eval()
    head.requires_grad_(False)
    return MaskedLM(encoder, head, tied)


@contextlib.contextmanager
def eager_attention(encoder: nn.Module) -> Iterator[None]:
    """Run ``encoder`` with eager attention: fused attention kernels (flash, memory-efficient) have no second
    derivative, and every L_p and Hessian-vector product of a run must use the same attention code."""
    config = getattr(encoder, "config", None)
    current = getattr(config, "_attn_implementation", None)
    if current in (None, "eager"):
        yield
        return
    encoder.set_attn_implementation("eager")
    try:
        yield
    finally:
        encoder.set_attn_implementation(current)


@contextlib.contextmanager
def evaluating(module: nn.Module) -> Iterator[None]:
    """Dropout off for the block, the previous train/eval mode of every submodule restored after it."""
    modes = {m: m.training for m in module.modules()}
    module.eval()
    try:
        yield
    finally:
        for m, mode in modes.items():
            m.training = mode


@torch.no_grad()
def lp_sums(mlm: EncoderLoss, batches: list[dict[str, torch.Tensor]], device, shard: bool = False) -> tuple[float, int]:
    """Σ loss and number of masked tokens over ``batches`` (float64 accumulation; eval mode, eager attention).

    ``shard``: called alike by every data-parallel rank, each rank runs its share of the batches
    (:func:`mtft.core.shards.sharded_map`) and the per-batch sums are added up in batch order on every rank -- the
    same float64 sum, bit for bit, as one process's. A pass that only some ranks make (the end-of-run probe, on
    rank 0) leaves it off."""

    def run(index: int) -> tuple[float, int]:
        loss, n = mlm(**{k: v.to(device) for k, v in batches[index].items()})
        return float(loss.double()), int(n)

    with evaluating(mlm), eager_attention(mlm.encoder):
        sums = sharded_map(len(batches), run) if shard else [run(i) for i in range(len(batches))]
    total, count = 0.0, 0
    for loss, n in sums:
        total += loss
        count += n
    return total, count


def lp_per_language(mlm: EncoderLoss, eval_set, batch_size: int, device, shard: bool = False) -> dict[str, float]:
    """L_p per language: the mean masked-LM loss over that language's masked tokens (``shard``: as in
    :func:`lp_sums`)."""
    out = {}
    for language in eval_set.languages:
        total, count = lp_sums(mlm, eval_set.batches(language, batch_size), device, shard)
        out[language] = total / count
    return out
