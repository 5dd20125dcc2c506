"""A parameter's full shape and size, also while DeepSpeed ZeRO-3 partitions it."""

from __future__ import annotations

import torch


def full_shape(param: torch.Tensor) -> torch.Size:
    """A parameter's shape, also under ZeRO-3, whose ``param.data`` is an empty placeholder outside its module's
    forward and backward (DeepSpeed keeps the shape in ``ds_shape``). The buffers are shaped by it and never read
    the parameter's values, so they are built and written while the parameter is partitioned."""
    return getattr(param, "ds_shape", param.shape)


def full_numel(param: torch.Tensor) -> int:
    """A parameter's number of elements, also under ZeRO-3 (see :func:`full_shape`)."""
    return int(getattr(param, "ds_numel", param.numel()))
