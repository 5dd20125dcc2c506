"""The optimizer's metric: the diagonal preconditioner P that AdamW applies to the gradient it is handed.

torch's AdamW (Loshchilov & Hutter, 2019; Kingma & Ba, 2015, Algorithm 1) steps

    θ ← θ − η·λ·θ − η · m̂_k / (√v̂_k + ε),      m̂_k = m_k / (1 − β1^k),   v̂_k = v_k / (1 − β2^k)

so, momentum aside, a gradient d is applied as P d with P = diag(1 / (√v̂ + ε)). Before step k the state holds
v_{k−1} and k − 1; :meth:`AdamWPreconditioner.diagonal` returns P_{k−1} = 1 / (√(v_{k−1} / (1 − β2^{k−1})) + ε),
exactly the preconditioner of the previous step (bias correction and ε as torch applies them). It is the
optimizer's own estimate of P_k: v̂_k differs from v̂_{k−1} only by the current gradient's share (1 − β2)/(1 − β2^k)
(0.1% late in training with β2 = 0.999; see docs/lfmlf.md for what this leaves unguaranteed). Before the first
step the state is empty (v = 0: Adam's first step is d/(|d| + ε), not linear in d) and SGD applies no
preconditioner at all: :meth:`diagonal` then returns None, the Euclidean metric.

Where the state lives: ZeRO stage 0 keeps torch's own per-parameter state; ZeRO 1 and 2 partition a flat fp32
copy between the ranks; each parameter's full state is assembled from its fragments by an all-reduce (every rank
must ask for the same parameters in the same order, which the Gram step does).
"""

from __future__ import annotations

from typing import Optional

import torch


class AdamWPreconditioner:
    """P = diag(1/(√v̂ + ε)) of the engine's AdamW for given parameters, or None for the Euclidean metric."""

    def __init__(self, engine):
        wrapper = engine.optimizer
        inner = getattr(wrapper, "optimizer", None)  # DeepSpeed's ZeRO / bf16 optimizers wrap a torch optimizer
        self.optimizer: torch.optim.Optimizer = inner if isinstance(inner, torch.optim.Optimizer) else wrapper
        self.adaptive = isinstance(self.optimizer, torch.optim.Adam)  # AdamW is an Adam subclass in torch ≥ 2.2
        self.partitioned = self.optimizer is not wrapper
        # ZeRO 1/2: the i-th group of the base optimizer is this rank's flat partition of the wrapper's i-th group
        if self.partitioned:
            groups = getattr(wrapper, "bit16_groups", None) or getattr(wrapper, "bf16_groups", None) or []
        else:
            groups = [group["params"] for group in self.optimizer.param_groups]
        self._group_of = {id(p): i for i, group in enumerate(groups) for p in group}

    def step(self) -> int:
        """Optimizer steps taken so far (0 before the first, and always for a non-adaptive optimizer)."""
        if not self.adaptive:
            return 0
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                state = self.optimizer.state.get(p)
                if state and "step" in state:
                    return int(state["step"])
        return 0

    def diagonal(self, params: list[torch.nn.Parameter]) -> Optional[dict[torch.nn.Parameter, torch.Tensor]]:
        """p = 1/(√v̂ + ε) in float32, one tensor of each parameter's shape; None when the metric is Euclidean
        (not an adaptive optimizer, or no step taken yet)."""
        if self.step() == 0:
            return None
        out = {}
        for p in params:
            group, state = self._group_and_state(p)
            beta2, eps, step = float(group["betas"][1]), float(group["eps"]), int(state.get("step", 0))
            if step == 0:  # never stepped (no gradient yet): v = 0
                out[p] = torch.full(p.shape, 1.0 / eps, dtype=torch.float32)
                continue
            v = self._exp_avg_sq(p, state).to(torch.float32)
            out[p] = 1.0 / (v.sqrt() / (1.0 - beta2**step) ** 0.5 + eps)
        return out

    def _group_and_state(self, param: torch.nn.Parameter) -> tuple[dict, dict]:
        """The parameter group that steps ``param`` and the state holding its step count."""
        group = self.optimizer.param_groups[self._group_of[id(param)]]
        # ZeRO 1/2: the state of this rank's flat partition of the group, whose step is the group's
        return group, self.optimizer.state.get(group["params"][0] if self.partitioned else param, {})

    def _exp_avg_sq(self, param: torch.nn.Parameter, state: dict) -> torch.Tensor:
        if not self.partitioned:
            return state["exp_avg_sq"]
        return _full_partitioned_state(param, state["exp_avg_sq"])


def _full_partitioned_state(param: torch.nn.Parameter, flat_state: torch.Tensor) -> torch.Tensor:
    """The full tensor of a ZeRO-1/2 optimizer state (``flat_state``: this rank's flat partition of the param's
    group), assembled as DeepSpeed's ``get_full_hp_param`` does: each rank writes the fragment it owns, an
    all-reduce over the data-parallel group sums them. Read from the base optimizer's state directly rather than
    through ``safe_get_full_optimizer_state``: DeepSpeed 0.19 links the state fragments after the *first* group's
    step, before the other groups have any state, so for parameters of a second group (e.g. the ones without weight
    decay) that call fails."""
    full = torch.zeros(param.numel(), dtype=torch.float32, device=flat_state.device)
    mapping = getattr(param, "_hp_mapping", None)
    if mapping is not None:  # None: no element of this parameter lies in this rank's partition
        lp, hp = mapping.lp_fragment_address, mapping.hp_fragment_address
        full.narrow(0, lp.start, lp.numel).copy_(flat_state.narrow(0, hp.start, hp.numel))
    group = getattr(param, "_dp_group", None)
    if torch.distributed.is_initialized() and torch.distributed.get_world_size(group) > 1:
        torch.distributed.all_reduce(full, group=group)
    return full.view(param.shape)
