"""The Multi-LoRA linear layer: h = W0·x + (α/r)·B_{task(x)}·A·x, routed per row in mixed batches.

PEFT routes mixed batches only at inference (``adapter_names=``) and loops over adapters; here A·x is computed
once for the whole batch and every row's own B is applied by one batched matrix product, so a mixed batch
trains all tasks at once. The layout is PEFT's: ``lora_A`` (r × in) is the input side, ``lora_B[i]``
(out × r) the output side of task i.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from mtft.models.rows import row_labels

class MultiLoraLinear(nn.Module):
    def __init__(self, base: nn.Linear, num_adapters: int, r: int, alpha: float, dropout: float, init_a: str,
                 generator: Optional[torch.Generator] = None):
        super().__init__()
        self.base_layer = base
        base.requires_grad_(False)
        device, dtype = base.weight.device, base.weight.dtype
        # A is a frozen *parameter* (not a buffer) so that it is saved in every checkpoint with the model.
        self.lora_A = nn.Parameter(torch.empty(r, base.in_features, device=device, dtype=dtype), requires_grad=False)
        self.lora_B = nn.Parameter(torch.zeros(num_adapters, base.out_features, r, device=device, dtype=dtype))
        self.scaling = alpha / r
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        if device.type != "meta":
            self._init_a(init_a, generator)

    @torch.no_grad()
    def _init_a(self, init_a: str, generator: Optional[torch.Generator]) -> None:
        if init_a == "gaussian":  # Algorithm 1 of the paper: i.i.d. N(0, 1)
            self.lora_A.normal_(0.0, 1.0, generator=generator)
        else:  # PEFT's default for lora_A: kaiming_uniform_(a=√5), i.e. U(-1/√in, 1/√in)
            bound = 1.0 / math.sqrt(self.lora_A.shape[1])
            self.lora_A.uniform_(-bound, bound, generator=generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base_layer(x)
        rows = row_labels("task", "MultiLoraLinear", x.shape[0])  # each row's task: whose B applies
        shared = nn.functional.linear(self.dropout(x), self.lora_A)  # A·x once for every task: (N, ..., r)
        per_row_b = self.lora_B.index_select(0, rows)  # (N, out, r)
        delta = torch.bmm(shared.reshape(x.shape[0], -1, shared.shape[-1]), per_row_b.transpose(1, 2))
        return out + self.scaling * delta.reshape(out.shape)

    def extra_repr(self) -> str:
        k, out, r = self.lora_B.shape
        return f"in={self.lora_A.shape[1]}, out={out}, r={r}, adapters={k}, scaling={self.scaling:g}"
