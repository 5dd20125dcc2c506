"""``data.leave_out``: train on S^i, the training set S with k examples removed, for the leave-one-out model
stability of Fu, So & Collier (2023, Def. 2.1 and 2.3; §4.2.7 removes 10%).

Which examples go is a function of ``data.leave_out.seed`` and the (task, language) alone -- not of ``run.seed`` --
so the runs of a study on S and S^i differ in nothing but the removed examples. The removal keeps everything else
of the run on S: the split is encoded whole (the same tokenisation cache as S), the rows of the removed examples
(every window or choice of them) are then dropped, and :class:`~mtft.data.sampler.MultiObjectiveSampler` visits
the remaining rows in S's own per-pass permutation with the removed rows skipped (:func:`kept_order`). A run on
S^i therefore sees exactly the batches of the run on S with the removed rows taken out and the later rows moved
up; only pass boundaries (every n − k rows instead of n) and, when several training units are mixed in
proportion to their sizes, the mixing probabilities follow from the smaller size.
"""

from __future__ import annotations

import hashlib
import math
from typing import Sequence

import datasets
import numpy as np

from mtft.config.schema import LeaveOutSection
from mtft.core.errors import DataError


def removed_count(n: int, spec: LeaveOutSection) -> int:
    """k: ``count``, or ``fraction`` × n rounded half up (0.1 of 25 examples is 3)."""
    return spec.count if spec.count is not None else int(math.floor(float(spec.fraction or 0.0) * n + 0.5))


def choose_removed(n: int, spec: LeaveOutSection, task: str, language: str, where: str) -> np.ndarray:
    """The sorted positions of the k examples (of the split's n) that S^i leaves out; one DataError line when k
    would remove none or all of them."""
    k = removed_count(n, spec)
    what = f"count={spec.count}" if spec.count is not None else f"fraction={spec.fraction:g}"
    if not 1 <= k < n:
        raise DataError(
            f"{where}: data.leave_out {what} removes {k} of {n} example(s); at least 1 must go and 1 remain"
        )
    rng = np.random.default_rng([spec.seed, _stable_int(task), _stable_int(language)])
    return np.sort(rng.choice(n, size=k, replace=False))


def removed_ids(ids: Sequence[str], removed: np.ndarray, where: str) -> set[str]:
    """The example ids of the removed positions. An encoded row knows its example only by id, so an id the split
    gives to more than one example cannot be removed alone: one DataError line."""
    chosen = {ids[int(i)] for i in removed}
    counts: dict[str, int] = {}
    for value in ids:
        if value in chosen:
            counts[value] = counts.get(value, 0) + 1
    shared = sorted(value for value, count in counts.items() if count > 1)
    if shared:
        raise DataError(
            f"{where}: data.leave_out needs unique example ids, but id {shared[0]!r} names {counts[shared[0]]} examples"
        )
    return chosen


def drop_rows(encoded: datasets.Dataset, gone: set[str]) -> tuple[datasets.Dataset, np.ndarray]:
    """The encoded split without the rows of the examples ``gone`` (order kept), and the positions of the rows
    kept among the split's rows (what the sampler skips by)."""
    kept = np.array([j for j, example in enumerate(encoded["id"]) if example not in gone], dtype=np.int64)
    return encoded.select(kept.tolist()), kept


def kept_order(order: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """A permutation of the whole split's rows (``order``), restricted to the ``kept`` rows (sorted positions)
    and renumbered to their rows in the reduced split: S's visiting order with the removed rows skipped."""
    mask = np.isin(order, kept)
    return np.searchsorted(kept, order[mask])


def describe(spec: LeaveOutSection, k: int) -> str:
    """How a split's origin reads after the removal."""
    what = f"{spec.count}" if spec.count is not None else f"{spec.fraction:g}"
    return f"leave_out {what} ({k} example(s), seed {spec.seed})"


def _stable_int(text: str) -> int:
    """A process-independent integer of ``text`` (Python's ``hash`` of a str changes between processes)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
