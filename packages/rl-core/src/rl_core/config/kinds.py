"""Switching a tagged section's ``kind`` in a later layer starts the section afresh.

A section typed as a union of configs told apart by a ``kind`` key (``data: {kind: arithmetic, digits: 2}``)
takes the keys of one member only. When a later layer (a command-line override, or a file over its
``defaults:``) changes ``kind``, the keys that earlier layers set in the section belong to the old kind:
``rl grpo data.kind=file data.train_path=x.jsonl`` on a recipe with an arithmetic ``data:`` section would
otherwise fail on ``digits`` and carry the arithmetic ``instruction`` over to the user's prompts. Those
keys are dropped here, before validation; keys set by the switching layer or later, and every
command-line override, stay (so a key of another kind written next to the new ``kind`` is still an error). Sections whose ``kind`` is a plain
setting (``loss.kind``, ``grpo.env_runner.kind``) keep their keys: only tagged unions are touched.
"""

from __future__ import annotations

import typing
from typing import Any

from pydantic import BaseModel

from rl_core.config.sources import KeyPath, SourceMap
from rl_core.config.validation import _flatten, _is_model


def drop_switched_kind_keys(schema_cls: type[BaseModel], data: dict[str, Any], sources: SourceMap) -> None:
    """Remove (in place) the keys of replaced kinds from every tagged-union section of ``data``."""
    if sources.kind_switches:
        _walk_model(schema_cls, data, (), sources)


def _walk_model(model: type[BaseModel], node: Any, path: KeyPath, sources: SourceMap) -> None:
    if not isinstance(node, dict):
        return
    for name, field in model.model_fields.items():
        if name in node:
            discriminator = field.discriminator if isinstance(field.discriminator, str) else None
            _walk_value(field.annotation, discriminator, node[name], (*path, name), sources)


def _walk_value(annotation: Any, discriminator: str | None, value: Any, path: KeyPath, sources: SourceMap) -> None:
    members = _flatten(annotation)
    if isinstance(value, list):
        for member in members:
            if typing.get_origin(member) is list and typing.get_args(member):
                item_type, item_discriminator = _unwrap(typing.get_args(member)[0])
                for index, item in enumerate(value):
                    _walk_value(item_type, item_discriminator, item, (*path, index), sources)
        return
    if not isinstance(value, dict):
        return
    models = [m for m in members if _is_model(m)]
    if discriminator is not None and len(models) > 1 and path in sources.kind_switches:
        _drop_earlier_keys(value, path, sources)
    for model in models:
        _walk_model(model, value, path, sources)
    for member in members:
        args = typing.get_args(member)
        if typing.get_origin(member) is dict and len(args) == 2:
            item_type, item_discriminator = _unwrap(args[1])
            for key, item in value.items():
                _walk_value(item_type, item_discriminator, item, (*path, key), sources)


def _drop_earlier_keys(section: dict[str, Any], path: KeyPath, sources: SourceMap) -> None:
    """Drop the keys the section held before its kind changed, unless a later layer set them again (the
    command-line overrides are one layer: their order among themselves does not matter)."""
    for key_path, source in sources.kind_switches[path].items():
        key = key_path[-1]
        if key in section and sources.lookup(key_path) == source and source.override is None:
            del section[key]
            sources.drop_subtree(key_path)


def _unwrap(tp: Any) -> tuple[Any, str | None]:
    """``Annotated[X, Field(discriminator="kind")]`` -> ``(X, "kind")``."""
    if typing.get_origin(tp) is typing.Annotated:
        inner, *metadata = typing.get_args(tp)
        for meta in metadata:
            if isinstance(getattr(meta, "discriminator", None), str):
                return inner, meta.discriminator
        return inner, None
    return tp, None
