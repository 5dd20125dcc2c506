"""Typed run configuration: :class:`RunConfig` and :func:`load_config`."""

from mtft.config.load import config_to_yaml, iter_options, load_config, validate_config
from mtft.config.run_config import RunConfig

__all__ = ["RunConfig", "config_to_yaml", "iter_options", "load_config", "validate_config"]
