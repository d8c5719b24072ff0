"""Strict configs: pydantic models, YAML files with ``defaults:`` inheritance, dotted overrides.

    from rl_core.config import StrictModel, load_config, ConfigError

    cfg = load_config(MyConfig, "recipe.yaml", ["grpo.max_steps=5"])

Every problem is reported at once with its file:line (or override), dotted key, value, what was
expected and a did-you-mean for misspelled keys. docs/configs.md has the long form.
"""

from rl_core.config.api import config_to_dict, dump_config, load_config
from rl_core.config.base import MAX_SEED, Seed, StrictModel
from rl_core.config.errors import ConfigError, ConfigProblem
from rl_core.config.loader import deep_merge, load_yaml_with_defaults
from rl_core.config.overrides import apply_overrides, parse_override
from rl_core.config.sources import Source, SourceMap

__all__ = [
    "ConfigError",
    "ConfigProblem",
    "MAX_SEED",
    "Seed",
    "Source",
    "SourceMap",
    "StrictModel",
    "apply_overrides",
    "config_to_dict",
    "deep_merge",
    "dump_config",
    "load_config",
    "load_yaml_with_defaults",
    "parse_override",
]
