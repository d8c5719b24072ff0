"""Read YAML into plain Python while recording the line of every key; reject duplicate keys."""

from __future__ import annotations

import re
from typing import Any

import yaml

from rl_core.config.errors import ConfigError, ConfigProblem
from rl_core.config.sources import KeyPath, Source, SourceMap, display_path


class ConfigLoader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e-5`` as a float (plain YAML 1.1 reads it as a string)."""


ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def parse_yaml_value(text: str) -> Any:
    """Parse one override value (``5``, ``1e-5``, ``[1, 2]``, ``{a: 1}``, ``null``) like a YAML scalar."""
    return yaml.load(text, Loader=ConfigLoader)


def load_yaml_file(path: str) -> tuple[Any, SourceMap]:
    """Read one YAML file (no ``defaults:`` handling). Returns the data and the line of each key."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ConfigError(ConfigProblem(display_path(path), "", "file not found")) from None
    except OSError as e:
        raise ConfigError(ConfigProblem(display_path(path), "", f"cannot read file: {e.strerror}")) from None
    return parse_yaml_text(text, path)


def parse_yaml_text(text: str, path: str) -> tuple[Any, SourceMap]:
    """Parse YAML ``text`` that came from ``path`` (used in messages)."""
    sources = SourceMap(Source(file=path))
    loader = ConfigLoader(text)
    try:
        node = loader.get_single_node()
        data = _to_python(node, loader, path, (), sources) if node is not None else None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{display_path(path)}:{mark.line + 1}" if mark else display_path(path)
        what = "; ".join(part for part in (e.context, e.problem) if part)
        raise ConfigError(ConfigProblem(where, "", f"YAML syntax error: {what}")) from None
    except yaml.YAMLError as e:
        raise ConfigError(ConfigProblem(display_path(path), "", f"YAML syntax error: {e}")) from None
    finally:
        loader.dispose()
    return data, sources


def _to_python(node: yaml.Node, loader: ConfigLoader, file: str, path: KeyPath, sources: SourceMap) -> Any:
    if isinstance(node, yaml.MappingNode):
        _reject_duplicate_keys(node, loader, file, path)
        loader.flatten_mapping(node)  # resolves YAML merge keys (<<: *anchor); explicit keys come last
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            child = (*path, key)
            sources.drop_subtree(child)
            sources.set(child, Source(file=file, line=key_node.start_mark.line + 1))
            result[key] = _to_python(value_node, loader, file, child, sources)
        return result
    if isinstance(node, yaml.SequenceNode):
        items = []
        for index, item_node in enumerate(node.value):
            child = (*path, index)
            sources.set(child, Source(file=file, line=item_node.start_mark.line + 1))
            items.append(_to_python(item_node, loader, file, child, sources))
        return items
    return loader.construct_object(node, deep=True)


def _reject_duplicate_keys(node: yaml.MappingNode, loader: ConfigLoader, file: str, path: KeyPath) -> None:
    """A key written twice in one mapping is an error (plain YAML silently keeps the last one)."""
    first_line: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        where = f"{display_path(file)}:{line}"
        if not isinstance(key, str | int | float | bool):
            raise ConfigError(ConfigProblem(where, "", f"a key must be a plain word or number, got {key!r}"))
        if key in first_line:
            message = f"duplicate key (first set on line {first_line[key]}); remove one of them"
            raise ConfigError(ConfigProblem(where, _join(path, key), message))
        first_line[key] = line


def _join(path: KeyPath, key: Any) -> str:
    return ".".join(str(part) for part in (*path, key))
