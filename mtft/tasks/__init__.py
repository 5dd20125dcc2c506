"""Task definitions: the :class:`Task` API, YAML task files, and discovery from folders."""

from mtft.tasks.base import DatasetRef, Task
from mtft.tasks.registry import discover_tasks, get_task

__all__ = ["DatasetRef", "Task", "discover_tasks", "get_task"]
