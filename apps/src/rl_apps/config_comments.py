"""``--print-config --comments``: the resolved config as YAML with each field's docstring above it as a
comment (a section without one gets its class's). Loading the text back gives the same config."""

from __future__ import annotations

import textwrap
from typing import Any

import yaml
from pydantic import BaseModel

from rl_core.config import config_to_dict

WIDTH = 100


def commented_yaml(config: BaseModel) -> str:
    lines: list[str] = []
    _emit(config, config_to_dict(config), 0, lines)
    return "\n".join(lines) + "\n"


def _emit(model: BaseModel, data: dict[str, Any], indent: int, lines: list[str]) -> None:
    pad = " " * indent
    fields = type(model).model_fields
    for name, value in data.items():
        child = getattr(model, name, None)
        doc = _doc(inherited_doc(type(model), name) if name in fields else None, child)
        if doc:
            if lines and indent == 0:
                lines.append("")
            lines += [f"{pad}# {line}" for line in textwrap.wrap(doc, WIDTH - indent - 2)]
        if isinstance(child, BaseModel) and isinstance(value, dict) and value:
            lines.append(f"{pad}{name}:")
            _emit(child, value, indent + 2, lines)
        else:
            dumped = yaml.safe_dump({name: value}, sort_keys=False, default_flow_style=False, allow_unicode=True,
                                    width=WIDTH)
            lines += [f"{pad}{line}" for line in dumped.rstrip("\n").split("\n")]


def _doc(field_doc: str | None, value: Any) -> str:
    """The field's docstring, else (for a section) its class's first paragraph, on one line."""
    text = field_doc or (type(value).__doc__ if isinstance(value, BaseModel) else None) or ""
    return " ".join(text.strip().split("\n\n")[0].split())


def inherited_doc(model: type[BaseModel], name: str) -> str:
    """The docstring of field ``name``, from the nearest class that documents it (a subclass that only
    changes the default keeps its base's text)."""
    for cls in model.__mro__:
        field = getattr(cls, "model_fields", {}).get(name)
        if field is not None and field.description:
            return " ".join(field.description.split())
    return ""
