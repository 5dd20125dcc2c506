"""Turn sampled (training unit, row) pairs and evaluation slices into padded tensor batches.

One batch mixes rows of any heads: one ``input_ids``/``attention_mask`` matrix for ONE encoder forward, the
``head_index`` and ``objective_index`` of every encoder row, and one ``labels`` matrix in which each head's
rows hold what that head's :meth:`~mtft.models.heads.Head.collate_labels` made of them (float64, padded with
IGNORE_INDEX). An encoded row whose ``input_ids`` is a list of C sequences (multiple choice) becomes C
encoder rows sharing one ``group_index`` value and the row's labels. Segment ids (``token_type_ids``: BERT marks
the second text of a pair with 1) go into the batch when the tokenizer wrote them; XLM-R's tokenizer writes none.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Optional

import torch

from mtft.core.labels import IGNORE_INDEX
from mtft.data.pipeline import PreparedData
from mtft.tasks.base import SEGMENTS
from mtft.tasks.kinds import head_class


class BatchBuilder:
    def __init__(self, data: PreparedData):
        self.data = data
        self.pad_id = data.tokenizer.pad_token_id
        # an evaluation-only task (evaluate_with: another task) is predicted by that task's head
        heads = [name for name, td in data.tasks.items() if td.task.evaluate_with is None]
        self.head_of_task = {name: heads.index(td.task.evaluate_with or name) for name, td in data.tasks.items()}
        self.kinds = [data.tasks[name].task.head for name in heads]

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
        return self.collate(rows, heads, objectives)

    def eval_batch_count(self, task: str, language: str, batch_size: int, dev: bool = False) -> int:
        """How many slices of ``batch_size`` rows the evaluation (or dev) data of (task, language) makes."""
        return -(-len(self._eval_dataset(task, language, dev)) // batch_size)

    def eval_batch(
        self, task: str, language: str, batch_size: int, index: int, dev: bool = False
    ) -> tuple[list[dict], dict]:
        """(encoded rows with all their columns, the padded batch) of slice ``index`` of the evaluation (or dev)
        data: rows index·batch_size … (index + 1)·batch_size."""
        chunk = self._eval_dataset(task, language, dev)[index * batch_size : (index + 1) * batch_size]
        rows = [dict(zip(chunk, values)) for values in zip(*chunk.values())]
        return rows, self.collate(rows, [self.head_of_task[task]] * len(rows))

    def _eval_dataset(self, task: str, language: str, dev: bool):
        td = self.data.tasks[task]
        return td.dev[language] if dev else td.eval[language]

    def collate(self, rows: list[dict], heads: list[int], objectives: Optional[list[int]] = None) -> dict:
        """Pad ``rows`` (encoded rows of the heads ``heads``) into one batch; see the module docstring."""
        sequences, segments, head_index, objective_index, group_index = [], [], [], [], []
        with_segments = all(row.get(SEGMENTS) is not None for row in rows)
        for n, row in enumerate(rows):
            ids = row["input_ids"]
            nested = bool(ids) and isinstance(ids[0], list)
            own = ids if nested else [ids]
            sequences += own
            if with_segments:
                segments += row[SEGMENTS] if nested else [row[SEGMENTS]]
            head_index += [heads[n]] * len(own)
            objective_index += [objectives[n] if objectives is not None else 0] * len(own)
            group_index += [n] * len(own)
        width = max(len(s) for s in sequences)
        input_ids = torch.full((len(sequences), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(sequences), width), dtype=torch.long)
        for i, sequence in enumerate(sequences):
            input_ids[i, : len(sequence)] = torch.tensor(sequence, dtype=torch.long)
            mask[i, : len(sequence)] = 1
        batch = {
            "input_ids": input_ids,
            "attention_mask": mask,
            "labels": self._labels(rows, heads, group_index),
            "head_index": torch.tensor(head_index, dtype=torch.long),
            "group_index": torch.tensor(group_index, dtype=torch.long),
        }
        if objectives is not None:
            batch["objective_index"] = torch.tensor(objective_index, dtype=torch.long)
        if with_segments:  # padded with segment 0, as the tokenizers' own padding does
            batch[SEGMENTS] = torch.zeros((len(sequences), width), dtype=torch.long)
            for i, segment in enumerate(segments):
                batch[SEGMENTS][i, : len(segment)] = torch.tensor(segment, dtype=torch.long)
        return batch

    def _labels(self, rows: list[dict], heads: list[int], group_index: list[int]) -> torch.Tensor:
        """Each head collates its own rows' labels; the blocks go into one matrix (one line per encoder row)."""
        blocks: dict[int, torch.Tensor] = {}
        for head in sorted(set(heads)):
            members = [n for n, h in enumerate(heads) if h == head]
            block = head_class(self.kinds[head]).collate_labels([rows[n]["labels"] for n in members])
            blocks.update(zip(members, block))
        width = max(block.shape[0] for block in blocks.values())
        out = torch.full((len(rows), width), float(IGNORE_INDEX), dtype=torch.float64)
        for n, block in blocks.items():
            out[n, : block.shape[0]] = block
        return out[torch.tensor(group_index, dtype=torch.long)]
