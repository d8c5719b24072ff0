"""Turn pydantic's ValidationError into ConfigProblems that name the file, line, key and a fix."""

from __future__ import annotations

import difflib
import types
import typing
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from rl_core.config.errors import ConfigProblem
from rl_core.config.sources import KeyPath, SourceMap, dotted


def problems_from_validation_error(
    error: ValidationError, schema_cls: type[BaseModel], data: Any, sources: SourceMap
) -> list[ConfigProblem]:
    """One problem per bad key (errors for the members of a union are merged into one)."""
    grouped: dict[tuple[KeyPath, str], list[str]] = {}
    for item in error.errors(include_url=False):
        located = _locate(schema_cls, data, item["loc"], item["type"])
        message = _message(item, located, schema_cls)
        kind = item["type"] if item["type"] in ("extra_forbidden", "missing") else "value"
        grouped.setdefault((located.path, kind), [])
        if message not in grouped[(located.path, kind)]:
            grouped[(located.path, kind)].append(message)
    problems = []
    for (path, kind), messages in grouped.items():
        if kind == "value" and len(messages) > 1:
            # a union: every member rejected the value; say what each would have wanted
            message = _merge_union_messages(messages)
        else:
            message = messages[0]
        problems.append(ConfigProblem(str(sources.lookup(path)), dotted(path), message))
    return problems


@dataclass
class _Located:
    """Where an error points: the key path in the user's data and what the schema says there."""

    path: KeyPath
    parent_models: list[type[BaseModel]]
    """The model(s) holding the last key of ``path``: their field names feed the did-you-mean."""
    field: FieldInfo | None
    """The schema's field at ``path``, when there is one."""
    missing_item: int | None = None
    """Index of a missing item of a fixed-length list (tuple); ``path`` is then the list's."""
    union_members: list[type[BaseModel]] = dataclass_field(default_factory=list)
    """The other members of a tagged union at the section holding the last key (their keys are not wrong,
    only of another ``kind``)."""


def _locate(schema_cls: type[BaseModel], data: Any, loc: tuple, error_type: str) -> _Located:
    node = data
    candidates: list[Any] = [schema_cls]  # the types the schema allows at the current path
    parents: list[type[BaseModel]] = [schema_cls]
    others: list[type[BaseModel]] = []  # members of a tagged union the current node is not
    field: FieldInfo | None = None
    path: list[str | int] = []
    for i, part in enumerate(loc):
        last = i == len(loc) - 1
        in_dict = isinstance(node, dict) and part in node
        in_list = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        if in_dict or in_list:
            parents = [c for c in candidates if _is_model(c)]
            field = next((c.model_fields[part] for c in parents if part in c.model_fields), None)
            candidates = _children(candidates, part)
            path.append(part)
            node = node[part]
            if not last:
                others = []
        elif last and error_type == "missing" and isinstance(node, list):
            # a tuple with too few items: point at the list itself
            return _Located(tuple(path), parents, field, missing_item=part)
        elif last and error_type == "missing":
            parents = [c for c in candidates if _is_model(c)]
            field = next((c.model_fields[part] for c in parents if part in c.model_fields), None)
            path.append(part)
            return _Located(tuple(path), parents, field)
        else:
            # a tag pydantic adds for the member of a union it tried ("int", "SubConfig", ...), or the
            # value of a tagged union's ``kind`` ("file")
            narrowed = [c for c in candidates if getattr(c, "__name__", None) == part or part in _kind_values(c)]
            others = [c for c in candidates if _is_model(c) and c not in narrowed] if narrowed else []
            candidates = narrowed or candidates
    return _Located(tuple(path), parents, field, union_members=others)


def _kind_values(tp: Any) -> list[Any]:
    """The values of a config's ``kind`` tag (``["file"]``), none for anything else."""
    if not _is_model(tp) or "kind" not in tp.model_fields:
        return []
    return _literal_values(tp.model_fields["kind"].annotation)


def _message(item: dict[str, Any], located: _Located, schema_cls: type[BaseModel]) -> str:
    error_type, value = item["type"], item.get("input")
    if error_type == "extra_forbidden":
        key = str(located.path[-1]) if located.path else "?"
        siblings = sorted({name for model in located.parent_models for name in model.model_fields})
        hint = _did_you_mean(key, [name for name in siblings if name != key])
        elsewhere = list(dict.fromkeys(p.rsplit(".", 1)[0] if "." in p else "(top level)"
                                       for p in _key_paths(schema_cls) if p.rsplit(".", 1)[-1] == key))
        kinds = [k for m in located.union_members if key in m.model_fields for k in _kind_values(m)]
        if kinds and located.path[:-1]:
            section = dotted(located.path[:-1])
            hint += f" '{key}' is a key of {section} with kind {' or '.join(map(str, kinds))}."
        elif elsewhere:
            hint += f" '{key}' is a key of: {', '.join(elsewhere[:3])}."
        elif not hint:
            hint = _valid_keys(siblings)
        return f"unknown key '{key}'.{hint}"
    if error_type == "missing" and located.missing_item is not None:
        expected = _type_name(located.field.annotation) if located.field else "more items"
        return f"item {located.missing_item} is missing; expected {expected}"
    if error_type == "missing":
        expected = _type_name(located.field.annotation) if located.field else "a value"
        return f"required key is missing (expected {expected}){_describe(located.field)}"
    expected = _expected(item)
    if error_type in ("value_error", "assertion_error") and isinstance(value, dict):
        return expected + ("" if expected.endswith(".") else ".")  # a rule across the fields of a section
    hint = ""
    if error_type == "literal_error" and isinstance(value, str) and located.field is not None:
        hint = _did_you_mean(value, [v for v in _literal_values(located.field.annotation) if isinstance(v, str)])
    return f"got {_show(value)}; expected {expected}.{hint}"


def _expected(item: dict[str, Any]) -> str:
    msg: str = item["msg"]
    for prefix in ("Input should be ", "Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            msg = msg[len(prefix) :]
            break
    if item["type"] in ("model_type", "dict_type", "model_attributes_type"):
        return "a mapping of keys to values (a section)"
    if msg.startswith(("greater than", "less than")):
        msg = "a value " + msg
    return msg.rstrip(".")


def _merge_union_messages(messages: list[str]) -> str:
    got = messages[0].split("; expected ")[0]
    wanted = [m.split("; expected ", 1)[1].rstrip(".") for m in messages if "; expected " in m]
    return f"{got}; expected {' or '.join(wanted)}."


def _did_you_mean(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" Did you mean '{close[0]}'?" if close else ""


def _valid_keys(choices: list[str]) -> str:
    if not choices:
        return ""
    shown = ", ".join(choices[:30]) + (", ..." if len(choices) > 30 else "")
    return f" Valid keys here: {shown}."


def _key_paths(model: type[BaseModel], prefix: str = "", depth: int = 0) -> list[str]:
    """Dotted paths of every field reachable through nested sections (for "'lr' is a key of ...")."""
    paths = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        paths.append(path)
        if depth < 8:
            for member in _flatten(field.annotation):
                if _is_model(member):
                    paths += _key_paths(member, path + ".", depth + 1)
    return paths


def _describe(field: FieldInfo | None) -> str:
    if field is None or not field.description:
        return ""
    return f" — {field.description.strip().splitlines()[0]}"


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping " + _truncate(repr(value))
    if isinstance(value, list):
        return "a list " + _truncate(repr(value))
    return _truncate(repr(value))


def _truncate(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _flatten(tp: Any) -> list[Any]:
    """``Annotated[X | None, ...]`` -> ``[X, NoneType]``."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _flatten(typing.get_args(tp)[0])
    if origin is typing.Union or origin is types.UnionType:
        return [member for arg in typing.get_args(tp) for member in _flatten(arg)]
    return [tp]


def _children(candidates: list[Any], part: str | int) -> list[Any]:
    """The types allowed at ``part`` below any of ``candidates``."""
    result: list[Any] = []
    for tp in candidates:
        for member in _flatten(tp):
            origin, args = typing.get_origin(member), typing.get_args(member)
            if _is_model(member) and part in member.model_fields:
                result += _flatten(member.model_fields[part].annotation)
            elif origin in (dict, typing.Mapping) and len(args) == 2:
                result += _flatten(args[1])
            elif origin in (list, set, frozenset) and args:
                result += _flatten(args[0])
            elif origin is tuple and args:
                index = part if isinstance(part, int) and args[-1] is not Ellipsis and part < len(args) else 0
                result += _flatten(args[index])
    return result


def _literal_values(tp: Any) -> list[Any]:
    return [
        v for member in _flatten(tp) if typing.get_origin(member) is typing.Literal for v in typing.get_args(member)
    ]


def _type_name(tp: Any) -> str:
    members = _flatten(tp)
    names = []
    for member in members:
        if member is type(None):
            names.append("null")
        elif _is_model(member):
            names.append(f"a section ({member.__name__})")
        elif typing.get_origin(member) is typing.Literal:
            names.append("one of " + ", ".join(repr(v) for v in typing.get_args(member)))
        elif isinstance(member, type):
            names.append(member.__name__)
        else:
            names.append(str(member).replace("typing.", ""))
    return " or ".join(names)
