"""Dotted command-line overrides: ``grpo.max_steps=5 policy.optimizer.lr=1e-5 logger.wandb=null``."""

from __future__ import annotations

import re
from typing import Any

import yaml

from rl_core.config.errors import ConfigProblem
from rl_core.config.sources import KeyPath, Source, SourceMap, dotted
from rl_core.config.yaml_io import parse_yaml_value

_KEY_PART = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$|^[0-9]+$")


def parse_override(text: str) -> tuple[KeyPath, Any]:
    """``"a.b.c=[1, 2]"`` -> ``(("a", "b", "c"), [1, 2])``. Values are read as YAML (``null`` is None).

    Raises ValueError with a message that says how an override is written.
    """
    key, sep, raw_value = text.partition("=")
    key = key.strip()
    if not sep:
        raise ValueError("an override must look like key.subkey=value (no '=' found)")
    if not key:
        raise ValueError("an override must look like key.subkey=value (the key before '=' is empty)")
    parts = key.split(".")
    for part in parts:
        if not _KEY_PART.match(part):
            raise ValueError(f"not a valid dotted key (bad part '{part}'); write key.subkey=value")
    try:
        value = parse_yaml_value(raw_value) if raw_value.strip() else ""
    except yaml.YAMLError as e:
        first_line = str(e).splitlines()[0]
        raise ValueError(
            f"cannot read the value '{raw_value}' as YAML ({first_line}); quote it if it is a string"
        ) from None
    path: KeyPath = tuple(int(p) if p.isdigit() else p for p in parts)
    return path, value


def apply_overrides(
    data: dict[str, Any], sources: SourceMap, overrides: list[str]
) -> tuple[dict[str, Any], list[ConfigProblem]]:
    """Apply each override to ``data`` (in place) and record its source. Returns the problems found."""
    problems: list[ConfigProblem] = []
    for text in overrides:
        source = Source(override=text)
        try:
            path, value = parse_override(text)
            if path[-1] == "kind":
                sources.record_kind_switch(path[:-1], _node(data, path[:-1]), value)
            path = _set(data, path, value)
        except ValueError as e:
            key = text.partition("=")[0].strip() if "=" in text else ""
            problems.append(ConfigProblem(str(source), key, str(e)))
            continue
        sources.drop_subtree(path)
        sources.set(path, source)
        for depth in range(1, len(path)):
            if path[:depth] not in sources:  # a section this override created
                sources.set(path[:depth], source)
    return data, problems


def _set(data: dict[str, Any], path: KeyPath, value: Any) -> KeyPath:
    """Set ``value`` at ``path``, creating missing sections. Returns the path as the keys really are."""
    node: Any = data
    actual: list[str | int] = []
    for depth, part in enumerate(path[:-1]):
        if isinstance(node, dict):
            key = part if part in node else str(part)
            actual.append(key)
            if node.get(key) is None:
                node[key] = {}  # an absent or null section; validation reports it if the schema has none
            elif not isinstance(node[key], dict | list):
                raise ValueError(f"'{dotted(path[: depth + 1])}' holds {node[key]!r}, not a section with keys")
            node = node[key]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            actual.append(part)
            node = node[part]
        else:
            raise ValueError(f"'{dotted(path[:depth])}' has no item '{part}'")
    last = path[-1]
    if isinstance(node, dict):
        last = last if last in node else str(last)
        node[last] = value
    elif isinstance(node, list) and isinstance(last, int) and last < len(node):
        node[last] = value
    else:
        raise ValueError(f"'{dotted(path[:-1])}' has no item '{last}' (it is a list of {len(node)} items)")
    return (*actual, last)


def _node(data: Any, path: KeyPath) -> Any:
    """The value at ``path``, or None when there is none."""
    for part in path:
        if isinstance(data, dict):
            data = data.get(part, data.get(str(part)))
        elif isinstance(data, list) and isinstance(part, int) and part < len(data):
            data = data[part]
        else:
            return None
    return data
