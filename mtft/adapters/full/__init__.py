"""Full fine-tuning: every encoder weight trains."""

from mtft.adapters.full.displacement import FullDisplacement
from mtft.adapters.full.method import FullFineTuning

__all__ = ["FullDisplacement", "FullFineTuning"]
