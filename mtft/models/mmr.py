"""The max-margin regulariser MMR (Fu, So & Collier, 2023, "A stability analysis of fine-tuning a pre-trained
model", eq. 8-9).

The paper, for labels y ∈ {−1, +1} and encoded features E(x_i)::

    R(S) = 1 / (1 + || Σ_i E(x_i) y_i ((1 + y_i) / Σ_j (1 + y_j) + (1 − y_i) / Σ_j (1 − y_j)) ||)

The sum is c₊ − c₋, the difference of the two class centres (a +1 row weighs 2 / (2 n₊) = 1 / n₊, a −1 row
−2 / (2 n₋)), so R = 1 / (1 + ||c₊ − c₋||) and the loss is task loss + α·R (eq. 9).

Multi-class generalisation (ours): with the K ≥ 2 classes present among the rows and their centres c_k,

    R = 1 / (1 + (2 / (K (K − 1))) Σ_{a < b} ||c_a − c_b||)

-- the reciprocal of one plus the mean pairwise centre distance. For K = 2 the mean is the single distance, so
R is exactly the paper's. Classes absent from the rows have no centre and take no part; with fewer than two
classes present there is no distance and the term is *undefined*: :func:`margin_regulariser` returns None
and nothing is added (the paper requires "each category should contain at least one sample").

No library provides this term (it is the paper's own, and its code was never released); it is a few tensor
operations, written here.
"""

from __future__ import annotations

from typing import Optional

import torch


def class_centres(features: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
    """``(K, d)`` mean feature of each class present in ``classes`` (ascending class id)."""
    present, inverse = torch.unique(classes, return_inverse=True)
    sizes = torch.bincount(inverse, minlength=present.numel()).to(features.dtype)
    sums = features.new_zeros(present.numel(), features.shape[1]).index_add(0, inverse, features)
    return sums / sizes[:, None]


def margin_regulariser(features: torch.Tensor, classes: torch.Tensor) -> Optional[torch.Tensor]:
    """R over the rows' ``(rows, d)`` features and their class ids (negative ids: unlabelled rows, left out).

    None when fewer than two classes are present (R is undefined, see the module's docstring)."""
    labelled = classes >= 0
    features, classes = features[labelled], classes[labelled]
    if classes.unique().numel() < 2:
        return None
    centres = class_centres(features, classes)
    first, second = torch.triu_indices(centres.shape[0], centres.shape[0], offset=1, device=centres.device)
    distances = torch.linalg.vector_norm(centres[first] - centres[second], dim=-1)
    return 1.0 / (1.0 + distances.mean())
