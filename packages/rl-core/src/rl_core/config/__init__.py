"""Strict configs: pydantic models, YAML files with ``defaults:`` inheritance, dotted overrides."""

from rl_core.config.base import StrictModel

__all__ = ["StrictModel"]
