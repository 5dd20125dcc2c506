"""Per-objective gradients of the shared parameters, exact and at about one backward pass."""

from mtft.gradients.layers import row_sparse_parameters
from mtft.gradients.layerwise import LayerwiseGradients
from mtft.gradients.per_objective import PerObjectiveGradients
from mtft.gradients.reference import reference_objective_gradients
from mtft.gradients.shapes import full_numel, full_shape
from mtft.gradients.sharded import ShardedGradients
from mtft.gradients.store import GradientStore

__all__ = [
    "GradientStore",
    "LayerwiseGradients",
    "PerObjectiveGradients",
    "ShardedGradients",
    "full_numel",
    "full_shape",
    "reference_objective_gradients",
    "row_sparse_parameters",
]
