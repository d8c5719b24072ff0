"""YAML files with ``defaults:`` inheritance, merged deeply, with the origin of every key kept."""

from __future__ import annotations

import os
from typing import Any

from rl_core.config.errors import ConfigError, ConfigProblem
from rl_core.config.sources import KeyPath, Source, SourceMap, display_path
from rl_core.config.yaml_io import load_yaml_file

DEFAULTS_KEY = "defaults"
"""Top-level key naming the file(s) this one builds on; paths are relative to the file itself."""


def load_yaml_with_defaults(path: str | os.PathLike[str]) -> tuple[dict[str, Any], SourceMap]:
    """Load ``path`` and, recursively, the files named by its ``defaults:`` key.

    ``defaults:`` is one path or a list of paths, relative to the file. They are merged in order,
    then the file's own keys on top: later wins. Mappings merge key by key (deeply); every other
    value, lists included, is replaced as a whole. Returns the merged mapping (without
    ``defaults``) and a SourceMap with the file and line of each key.
    """
    return _load(os.path.abspath(os.fspath(path)), stack=())


def _load(path: str, stack: tuple[str, ...]) -> tuple[dict[str, Any], SourceMap]:
    data, sources = load_yaml_file(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            ConfigProblem(
                display_path(path),
                "",
                f"the top level of a config file must be a mapping of keys to values, got {_kind(data)}",
            )
        )
    own_defaults = data.pop(DEFAULTS_KEY, None)
    parent_paths = _defaults_paths(own_defaults, path, sources)

    merged: dict[str, Any] = {}
    merged_sources = SourceMap(Source(file=path))
    for parent in parent_paths:
        if parent in (*stack, path):
            start = os.path.dirname((*stack, path)[0])
            chain = " -> ".join(os.path.relpath(p, start) for p in (*stack, path, parent))
            where = str(sources.lookup((DEFAULTS_KEY,)))
            raise ConfigError(ConfigProblem(where, DEFAULTS_KEY, f"circular defaults: {chain}"))
        parent_data, parent_sources = _load(parent, (*stack, path))
        merged = deep_merge(merged, parent_data, merged_sources, parent_sources)
    sources.drop_subtree((DEFAULTS_KEY,))
    merged = deep_merge(merged, data, merged_sources, sources)
    return merged, merged_sources


def _defaults_paths(value: Any, path: str, sources: SourceMap) -> list[str]:
    where = str(sources.lookup((DEFAULTS_KEY,)))
    if value is None:
        return []
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise ConfigError(
            ConfigProblem(where, DEFAULTS_KEY, f"expected a file path or a list of file paths, got {value!r}")
        )
    resolved = []
    base_dir = os.path.dirname(path)
    for name in names:
        parent = os.path.normpath(os.path.join(base_dir, os.path.expanduser(name)))
        if not os.path.isfile(parent):
            raise ConfigError(
                ConfigProblem(
                    where, DEFAULTS_KEY, f"defaults file '{name}' not found (looked for {display_path(parent)})"
                )
            )
        resolved.append(parent)
    return resolved


def deep_merge(
    base: dict[str, Any],
    override: dict[str, Any],
    base_sources: SourceMap | None = None,
    override_sources: SourceMap | None = None,
    prefix: KeyPath = (),
) -> dict[str, Any]:
    """Merge ``override`` into a copy of ``base``: dicts merge key by key, anything else is replaced.

    When source maps are given, ``base_sources`` is updated in place to describe the result.
    """
    result = dict(base)
    if base_sources is not None and override_sources is not None:
        if "kind" in override:
            base_sources.record_kind_switch(prefix, base, override["kind"])
        if not prefix:
            base_sources.kind_switches.update(override_sources.kind_switches)
    for key, value in override.items():
        path = (*prefix, key)
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            if base_sources is not None and override_sources is not None and path in override_sources:
                base_sources.set(path, override_sources.get(path))
            result[key] = deep_merge(result[key], value, base_sources, override_sources, path)
            continue
        result[key] = value
        if base_sources is not None and override_sources is not None:
            base_sources.drop_subtree(path)
            for sub_path, source in override_sources.subtree(path).items():
                base_sources.set(sub_path, source)
    return result


def _kind(value: Any) -> str:
    if isinstance(value, list):
        return "a list"
    return f"{type(value).__name__} {value!r}"
