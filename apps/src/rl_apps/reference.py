"""docs/config_reference.md: every command's keys with their types, defaults and docstrings, generated from
the config classes (``python scripts/gen_config_reference.py``; a test checks the file is current).

Each command gets a table of its top-level keys; every section class (``policy:``, ``logger:``, each kind
of ``data:``) gets one table, once, linked from wherever it is used. A command whose default for a
section differs from the section's own defaults (``rl rm``'s ``policy.task``) says so in its table.
"""

from __future__ import annotations

import importlib
import json
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from rl_apps.commands import COMMANDS
from rl_apps.config_comments import inherited_doc
from rl_core.config import config_to_dict
from rl_core.config.validation import _flatten as _members
from rl_core.config.validation import _is_model

HEADER = """# Config reference

Every key of every `rl` command: its type, default and meaning. Generated from the config classes and their
field docstrings by `python scripts/gen_config_reference.py`; `tests/integration/test_config_reference.py`
fails when this file is out of date. On the command line, `rl <command> --help` shows the main keys and
`rl <command> --print-config --comments` the resolved config with these texts as comments.

Defaults are the config classes' own; a recipe (`--config`, or the command's default recipe) sets its
own values on top (docs/configs.md).
"""


def render_reference() -> str:
    """The whole markdown file."""
    sections: dict[str, type[BaseModel]] = {}
    parts = [HEADER, "## Commands", ""]
    parts += [f"- [`rl {name}`](#rl-{name})" for name in COMMANDS]
    for name, spec in COMMANDS.items():
        module = importlib.import_module(spec.module)
        _collect(module.CONFIG_CLASS, sections)
        parts += ["", f"## rl {name}", "", _command_intro(spec, module), ""]
        parts += _table(module.CONFIG_CLASS, module.CONFIG_CLASS())
    parts += ["", "## Sections", ""]
    for anchor in sorted(sections, key=str.lower):
        cls = sections[anchor]
        parts += [f"### {anchor}", "", _class_doc(cls), ""]
        parts += _table(cls, _default_instance(cls)) + [""]
    return "\n".join(parts).rstrip() + "\n"


def _collect(cls: type[BaseModel], sections: dict[str, type[BaseModel]]) -> None:
    """Every section class reachable from ``cls`` (through unions, lists and dicts)."""
    for field in cls.model_fields.values():
        for model in _models_in(field.annotation):
            if sections.get(_anchor(model), model) is not model:
                raise ValueError(f"two section classes are named {_anchor(model)} ({model.__module__} and "
                                 f"{sections[_anchor(model)].__module__}); rename one so the reference can link it")
            if _anchor(model) not in sections:
                sections[_anchor(model)] = model
                _collect(model, sections)


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    found = []
    for member in _members(annotation):
        if _is_model(member):
            found.append(member)
        else:
            found += [m for arg in typing.get_args(member) for m in _models_in(arg)]
    return found


def _command_intro(spec, module) -> str:
    recipe = Path(module.DEFAULT_RECIPE).name if module.DEFAULT_RECIPE else "none"
    cls = module.CONFIG_CLASS
    return f"{spec.summary[0].upper()}{spec.summary[1:]}. Config class `{cls.__module__}.{cls.__qualname__}`; default recipe `{recipe}`."


def _table(cls: type[BaseModel], instance: BaseModel | None) -> list[str]:
    rows = ["| key | type | default | description |", "|---|---|---|---|"]
    for name, field in cls.model_fields.items():
        models = [m for m in _members(field.annotation) if _is_model(m)]
        default = _default(field, getattr(instance, name, PydanticUndefined) if instance is not None else
                           PydanticUndefined)
        doc = inherited_doc(cls, name) or (models[0].__doc__ if len(models) == 1 else "") or ""
        rows.append(f"| `{name}` | {_type(field.annotation)} | {default} | {_cell(doc)} |")
    return rows


def _default(field, value: Any) -> str:
    if value is PydanticUndefined:
        value = field.get_default(call_default_factory=True)
    if value is PydanticUndefined:
        return "required"
    if isinstance(value, BaseModel):
        own = _default_instance(type(value))
        changed = _changed(config_to_dict(value), config_to_dict(own)) if own is not None else {}
        return f"`kind: {value.kind}`" if "kind" in type(value).model_fields and len(_members(field.annotation)) > 2 \
            else ("section" + (f"; differs: {_cell(_flow(changed))}" if changed else ""))
    plain = _plain(value)
    if isinstance(plain, list) and any(isinstance(item, dict) for item in plain):
        return f"{len(plain)} section(s)"
    return f"`{_cell(_flow(plain))}`"


def _changed(value: dict, default: dict) -> dict:
    out = {}
    for key, item in value.items():
        if isinstance(item, dict) and isinstance(default.get(key), dict):
            sub = _changed(item, default[key])
            if sub:
                out[key] = sub
        elif default.get(key) != item:
            out[key] = item
    return out


def _default_instance(cls: type[BaseModel]) -> BaseModel | None:
    """``cls()``, or None when it has required keys."""
    try:
        return cls()
    except ValueError:
        return None


def _type(annotation: Any) -> str:
    names = []
    for member in _members(annotation):
        origin, args = typing.get_origin(member), typing.get_args(member)
        if member is type(None):
            names.append("null")
        elif _is_model(member):
            names.append(f"[{member.__name__}](#{_anchor(member).lower()})")
        elif origin is typing.Literal:
            names.append(" \\| ".join(f"`{a}`" for a in args))
        elif origin in (list, tuple, dict, set):
            inner = ", ".join(_type(a) for a in args if a is not Ellipsis)
            names.append(f"{origin.__name__} of {inner}" if origin is not dict else f"dict of {inner}")
        elif member is Any:
            names.append("any")
        else:
            names.append(getattr(member, "__name__", str(member)))
    return " \\| ".join(names)


def _anchor(cls: type[BaseModel]) -> str:
    return cls.__name__


def _class_doc(cls: type[BaseModel]) -> str:
    doc = " ".join((cls.__doc__ or "").split())
    return f"`{cls.__module__}.{cls.__qualname__}`" + (f": {doc}" if doc else "")


def _plain(value: Any) -> Any:
    return config_to_dict(_Holder(value=value))["value"] if not isinstance(value, str | int | float | bool) \
        else value


class _Holder(BaseModel):
    value: Any


def _flow(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else value


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")
