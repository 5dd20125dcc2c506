"""The multi-task model: one shared encoder, one head per task."""

from __future__ import annotations

from typing import Any, Mapping, Optional

import torch
from torch import nn

from mtft.core.rows import labelled_rows
from mtft.models.heads import HeadOutput
from mtft.models.mmr import margin_regulariser


class MultiTaskModel(nn.Module):
    """Encoder + heads. ``forward`` returns per-objective loss sums and counts for a mixed batch.

    The objective and task of every row are declared with :func:`~mtft.core.rows.labelled_rows`, so that
    Multi-LoRA layers route rows to their task's B and LF-MLF's hooks attribute gradients to objectives.
    Every head runs on every step -- on zero rows when its task is absent -- so that each process sees the
    same parameters take part in each step; ZeRO's gradient collectives require it when ranks draw different
    tasks.

    ``mmr`` (α ≥ 0) adds the max-margin regulariser α·R (Fu, So & Collier, 2023, eq. 9; :mod:`mtft.models.mmr`)
    to the loss of every head that classifies (``Head.classifies``); other heads are left as they are. R is
    computed per forward (one micro-batch on one rank) and per (head, objective) over that objective's rows, and
    joins the objective's loss *sum* as α·R per loss unit: the objective's mean over the micro-batch is then
    exactly task loss + α·R (eq. 9), and over several micro-batches or ranks it is the task loss plus α times the
    count-weighted mean of their R. Because the term sits in the per-objective sums, every weighting -- those
    that read the losses and those that read per-objective gradients -- sees it, and its gradient belongs to the
    objective whose rows formed it. A group with fewer than two classes present adds nothing. It is a training
    term: in eval mode (evaluation losses) the heads' losses are returned as they are.
    """

    def __init__(self, encoder: nn.Module, heads: Mapping[str, nn.Module], num_objectives: int, mmr: float = 0.0):
        super().__init__()
        self.encoder = encoder
        self.heads = nn.ModuleDict(dict(heads))
        self.num_objectives = num_objectives
        self.head_position = {name: k for k, name in enumerate(self.heads)}
        self.mmr = mmr
        # R of each (micro-batch, objective) group per head since the last drain_regularisers(), for the logs
        self.regularisers: dict[str, list[torch.Tensor]] = {}

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        labels: torch.Tensor,
        head_index: torch.Tensor,
        objective_index: torch.Tensor,
        group_index: Optional[torch.Tensor] = None,
        token_type_ids: Optional[torch.Tensor] = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-objective loss sums and counts. One row per encoder row; ``labels`` is the batch's label matrix
        (see :mod:`mtft.models.heads`); ``group_index`` marks encoder rows of one example (multiple choice);
        ``token_type_ids`` are the tokenizer's segment ids, where it writes them (BERT)."""
        with labelled_rows(objective=objective_index, task=head_index):
            hidden = self.encode(input_ids, attention_mask, token_type_ids)
        sums = hidden.new_zeros(self.num_objectives)
        counts = hidden.new_zeros(self.num_objectives)
        for k, (name, head) in enumerate(self.heads.items()):
            rows = (head_index == k).nonzero(as_tuple=True)[0]
            objectives = objective_index.index_select(0, rows)
            context = {"attention_mask": attention_mask.index_select(0, rows)}
            if group_index is not None:
                context["group_index"] = group_index.index_select(0, rows)
            with labelled_rows(objective=objectives, task=head_index.index_select(0, rows)):
                out = head(hidden.index_select(0, rows), labels.index_select(0, rows), **context)
            loss_sum = out.loss_sum
            if self.training and self.mmr > 0 and out.features is not None and out.classes is not None:
                loss_sum = loss_sum + self.mmr * self._regulariser_per_row(name, objectives, out)
            sums = sums.index_add(0, objectives, loss_sum)
            counts = counts.index_add(0, objectives, out.loss_count.to(counts.dtype))
        return sums, counts

    def _regulariser_per_row(self, head: str, objectives: torch.Tensor, out: HeadOutput) -> torch.Tensor:
        """(rows,) R of each row's objective group on its loss units (0 elsewhere), so that the group's loss
        sum gains R once per loss unit."""
        assert out.features is not None and out.classes is not None
        per_row = out.loss_sum.new_zeros(out.loss_sum.shape)
        for objective in objectives.unique().tolist():
            group = objectives == objective
            value = margin_regulariser(out.features[group], out.classes[group])
            if value is None:
                continue
            units = torch.where(group, out.loss_count, 0.0)
            per_row = per_row + value.to(per_row.dtype) * units
            self.regularisers.setdefault(head, []).append(value.detach())
        return per_row

    def drain_regularisers(self) -> dict[str, float]:
        """``mmr/<head>``: the mean R of each head since the last call (heads with no defined R left out)."""
        values = {f"mmr/{head}": float(torch.stack(rs).mean()) for head, rs in self.regularisers.items() if rs}
        self.regularisers = {}
        return values

    def encode(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: Optional[torch.Tensor]
    ) -> torch.Tensor:
        """The encoder's last hidden states; segment ids only where the tokenizer wrote them (an encoder without
        segments, e.g. DistilBERT, takes no such argument)."""
        segments = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask, **segments).last_hidden_state

    @torch.no_grad()
    def predict_logits(
        self,
        head: str,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        group_index: Optional[torch.Tensor] = None,
        objective: Optional[int] = None,
        token_type_ids: Optional[torch.Tensor] = None,
    ) -> Any:
        """Logits of ``head`` for a batch of its rows; ``objective`` (the rows' loss objective, where it is
        a trained one) routes adapters kept per objective; ``group_index`` and ``token_type_ids`` as in
        :meth:`forward`."""

        def rows(value: int) -> torch.Tensor:
            return torch.full((input_ids.shape[0],), value, dtype=torch.long, device=input_ids.device)

        with labelled_rows(
            task=rows(self.head_position[head]), objective=None if objective is None else rows(objective)
        ):
            hidden = self.encode(input_ids, attention_mask, token_type_ids)
        context = {"attention_mask": attention_mask}
        if group_index is not None:
            context["group_index"] = group_index
        return self.heads[head].logits(hidden, **context)
