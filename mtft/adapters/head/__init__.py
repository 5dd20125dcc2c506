"""Head-only training: the encoder stays frozen."""

from mtft.adapters.head.method import HeadOnly

__all__ = ["HeadOnly"]
