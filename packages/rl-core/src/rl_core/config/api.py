"""The entry points: load a config class from YAML + overrides, and print it back as YAML."""

from __future__ import annotations

import enum
import os
import pathlib
from collections.abc import Sequence
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from rl_core.config.errors import ConfigError
from rl_core.config.kinds import drop_switched_kind_keys
from rl_core.config.loader import load_yaml_with_defaults
from rl_core.config.overrides import apply_overrides
from rl_core.config.sources import Source, SourceMap
from rl_core.config.validation import problems_from_validation_error

ModelT = TypeVar("ModelT", bound=BaseModel)


def load_config(schema_cls: type[ModelT], path: str | os.PathLike[str] | None, overrides: Sequence[str] = ()) -> ModelT:
    """Load ``path`` (with its ``defaults:``), apply dotted ``overrides``, validate into ``schema_cls``.

    ``path=None`` starts from the schema's own defaults. Raises ConfigError listing every problem
    found (each with its file:line or override, dotted key, value and what was expected). Nothing
    else happens here: no directory is created and nothing is logged, so a caller that loads the
    config first leaves no trace of a bad run.
    """
    if path is None:
        data: dict[str, Any] = {}
        sources = SourceMap(Source(file="<no config file>"))
    else:
        data, sources = load_yaml_with_defaults(path)
    data, problems = apply_overrides(data, sources, list(overrides))
    drop_switched_kind_keys(schema_cls, data, sources)  # `data.kind=file` over an arithmetic `data:` section
    config = None
    try:
        config = schema_cls.model_validate(data)
    except ValidationError as e:
        problems += problems_from_validation_error(e, schema_cls, data, sources)
    if problems or config is None:
        raise ConfigError(problems)
    return config


def config_to_dict(config: BaseModel) -> dict[str, Any]:
    """The config as plain YAML-safe Python (dicts, lists, str, int, float, bool, None)."""
    return _plain(config.model_dump(mode="python"))


def dump_config(config: BaseModel) -> str:
    """The resolved config as YAML; loading it back gives an equal config (``--print-config``)."""
    return yaml.safe_dump(config_to_dict(config), sort_keys=False, default_flow_style=False, allow_unicode=True)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k) if not isinstance(k, str | int | float | bool) else k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(v) for v in value]
    if isinstance(value, enum.Enum):
        return _plain(value.value)
    if isinstance(value, pathlib.PurePath):
        return str(value)
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)
