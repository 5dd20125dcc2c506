"""The masked-LM loss L_p of an encoder: the fine-tuned encoder under the backbone's own MLM head.

The head is taken from ``AutoModelForMaskedLM`` of the backbone (its pre-trained head; a freshly initialised one
for the untrained ``tiny`` encoder) and is never trained by fine-tuning. Where the backbone ties its output
embedding to the input embedding (XLM-R, BERT), the head's decoder is re-tied to the *fine-tuned* encoder's
embedding, exactly as the fine-tuned model would be saved and reloaded as a masked-LM.

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


class MaskedLM(nn.Module):
    """``encoder`` (shared, not copied) + MLM ``head``. ``forward`` returns (loss sum, masked-token count)."""

    def __init__(self, encoder: nn.Module, head: nn.Module, tied_output: Optional[nn.Module] = None):
        super().__init__()
        self.encoder = encoder
        self.head = head
        if tied_output is not None:
            tied_output.weight = encoder.get_input_embeddings().weight
        self.adapter = 0  # the task adapter (Multi-LoRA) that every row is routed to

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        task = torch.full((input_ids.shape[0],), self.adapter, dtype=torch.long, device=input_ids.device)
        # adapters route by the declared task, or by objective with model.adapter.granularity: objective
        with labelled_rows(task=task, objective=task):
            hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        targets = labels != IGNORE_INDEX
        logits = self.head(hidden[targets])
        loss = nn.functional.cross_entropy(logits.float(), labels[targets], reduction="sum")
        return loss, targets.sum()

    @contextlib.contextmanager
    def routed_to(self, adapter: int) -> Iterator[None]:
        previous, self.adapter = self.adapter, adapter
        try:
            yield
        finally:
            self.adapter = previous


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
    """The backbone as a masked-LM: from the Hub or a folder, or built from ``config`` (the tiny encoder)."""
    if config is not None:
        with torch.random.fork_rng(devices=[]):  # a fresh head must not move the run's RNG
            torch.manual_seed(0)
            return AutoModelForMaskedLM.from_config(config)
    try:
        return AutoModelForMaskedLM.from_pretrained(backbone, revision=revision, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"cannot load the masked-LM head of model.backbone={backbone!r}: {first}") from None


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
def lp_sums(mlm: MaskedLM, batches: list[dict[str, torch.Tensor]], device) -> tuple[float, int]:
    """Σ loss and number of masked tokens over ``batches`` (float64 accumulation; eval mode, eager attention)."""
    total, count = 0.0, 0
    with evaluating(mlm), eager_attention(mlm.encoder):
        for batch in batches:
            loss, n = mlm(**{k: v.to(device) for k, v in batch.items()})
            total += float(loss.double())
            count += int(n)
    return total, count


def lp_per_language(mlm: MaskedLM, eval_set, batch_size: int, device) -> dict[str, float]:
    """L_p per language: the mean masked-LM loss over that language's masked tokens."""
    out = {}
    for language in eval_set.languages:
        total, count = lp_sums(mlm, eval_set.batches(language, batch_size), device)
        out[language] = total / count
    return out
