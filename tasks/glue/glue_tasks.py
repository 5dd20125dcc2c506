"""The GLUE task classes that task files here name with ``class:`` (defined in the library, tested there)."""

from mtft.tasks.classification import ClassificationTask

__all__ = ["ClassificationTask"]
