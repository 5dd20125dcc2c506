"""The SuperGLUE task classes that task files here name with ``class:`` (defined in the library, tested there)."""

from mtft.tasks.superglue import AXgTask, MultiRCTask, RecordTask, WiCTask, WSCTask

__all__ = ["AXgTask", "MultiRCTask", "RecordTask", "WiCTask", "WSCTask"]
