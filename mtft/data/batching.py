"""Turn sampled (training unit, row) pairs and evaluation slices into padded tensor batches."""

from __future__ import annotations

from collections import defaultdict
from typing import Iterator

import torch

from mtft.data.pipeline import PreparedData


class BatchBuilder:
    def __init__(self, data: PreparedData):
        self.data = data
        self.pad_id = data.tokenizer.pad_token_id
        self.head_of_task = {name: k for k, name in enumerate(data.tasks)}

    def train_batch(self, pairs: list[tuple[int, int]]) -> dict[str, torch.Tensor]:
        """Rows in the order of ``pairs``; each carries its head and loss-objective index."""
        by_unit: dict[int, list[int]] = defaultdict(list)
        for unit, row in pairs:
            by_unit[unit].append(row)
        fetched = {unit: self.data.train_dataset(unit)[rows] for unit, rows in by_unit.items()}
        taken = defaultdict(int)
        rows = []
        for unit, _ in pairs:
            rows.append({k: v[taken[unit]] for k, v in fetched[unit].items()})
            taken[unit] += 1
        heads = [self.head_of_task[self.data.train_units[u].task] for u, _ in pairs]
        objectives = [self.data.unit_objective[u] for u, _ in pairs]
        return {
            **self.pad(rows),
            "head_index": torch.tensor(heads, dtype=torch.long),
            "objective_index": torch.tensor(objectives, dtype=torch.long),
        }

    def eval_batches(self, task: str, language: str, batch_size: int) -> Iterator[tuple[list[str], dict]]:
        dataset = self.data.tasks[task].eval[language]
        for start in range(0, len(dataset), batch_size):
            chunk = dataset[start : start + batch_size]
            rows = [dict(zip(chunk, values)) for values in zip(*chunk.values())]
            yield chunk["id"], self.pad(rows)

    def pad(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        width = max(len(r["input_ids"]) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r["input_ids"])] = torch.tensor(r["input_ids"])
            mask[i, : len(r["input_ids"])] = 1
        labels = torch.tensor([r["labels"] for r in rows], dtype=torch.long)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}
