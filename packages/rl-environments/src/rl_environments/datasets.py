"""Prompt files (JSONL / JSON / parquet, or a ``datasets`` directory) as ``PromptSample``s, every row checked.

The prompt is a string (one user message) or a list of ``{role, content}`` messages (TRL's plain and
conversational prompt-only rows); a ready chat may also come from ``messages_field``. A row is bad when
a field is missing, the prompt is an empty string, the messages are not a list of ``{role, content}``
strings, or the answer is null or not a string / number; the caller's ``check`` may refuse more (a
prompt longer than its token budget). Bad rows stop the load with the file and row named, or are skipped and counted
(``on_bad_row``), by :mod:`rl_core.data_files`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rl_core.data_files import BadRow, Loaded, load_rows
from rl_core.types import PromptSample
from rl_environments.config import PromptFieldsConfig
from rl_environments.dataset_base import PromptCheck


def load_prompt_file(path: str | Path, cfg: PromptFieldsConfig, check: PromptCheck | None = None, *,
                     section: str = "data", split: str | None = None) -> Loaded[PromptSample]:
    """PromptSamples from a file or a ``datasets`` directory (``split``: of a saved DatasetDict), with the
    field mapping of ``cfg``; each also passes ``check``. ``section``: the config section of ``cfg``
    (named in errors)."""

    def convert(row: dict[str, Any]) -> PromptSample:
        sample = record_to_sample(row, cfg)
        if check is not None:
            check(sample)
        return sample

    if cfg.images_field is not None:  # prompts with images (image_prompts.py)
        from rl_environments.image_prompts import load_image_prompt_file

        return load_image_prompt_file(path, cfg, check, section=section, split=split)
    return load_rows(path, convert, on_bad_row=cfg.on_bad_row, file_format=cfg.format, section=section, split=split)


PROMPT_FIELD_ALIASES = {"prompt": ("problem",)}
"""Fields read when a row lacks the default prompt field (older prompt files name it ``problem``)."""


def record_to_sample(row: dict[str, Any], cfg: PromptFieldsConfig) -> PromptSample:
    """One row as a PromptSample; raises :class:`~rl_core.data_files.BadRow` for a row it cannot use."""
    if cfg.messages_field:
        messages = _messages(_field(row, cfg.messages_field), cfg.messages_field)
    else:
        name = _prompt_field(row, cfg.prompt_field)
        value = _field(row, name, hint="set prompt_field (or messages_field) to the field holding the prompt")
        if isinstance(value, list):  # a conversational prompt, as in TRL's datasets
            messages = _messages(value, name)
        else:
            messages = [{"role": "user", "content": _text(value, name, "or a list of {role, content} messages")}]
    return prompt_sample(messages, row, cfg)


def prompt_sample(messages: list[dict[str, Any]], row: dict[str, Any], cfg: PromptFieldsConfig) -> PromptSample:
    """The PromptSample of a row's ``messages``: instruction, system prompt, metadata and answer from ``cfg``."""
    if cfg.instruction:
        messages = _with_instruction(messages, cfg.instruction)
    if cfg.system_prompt and not any(m["role"] == "system" for m in messages):
        messages.insert(0, {"role": "system", "content": cfg.system_prompt})
    metadata = {name: _field(row, name) for name in cfg.metadata_fields}
    if cfg.answer_field:
        answer = _field(row, cfg.answer_field, hint="set answer_field to the field holding the reference answer, "
                                                    "or to null for none")
        if answer is None or isinstance(answer, bool) or not isinstance(answer, str | int | float):
            raise BadRow(f"field {cfg.answer_field!r} must be a string or a number, got {_kind(answer)}")
        metadata["answer"] = str(answer)
    return PromptSample(messages=messages, metadata=metadata, env=getattr(cfg, "env", None))


def _prompt_field(row: dict[str, Any], name: str) -> str:
    """``name``, or an alias of it that the row has instead."""
    if name in row:
        return name
    return next((alias for alias in PROMPT_FIELD_ALIASES.get(name, ()) if alias in row), name)


def _with_instruction(messages: list[dict[str, str]], instruction: str) -> list[dict[str, str]]:
    """``instruction`` appended to the last user message."""
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
    if last_user is None:
        raise BadRow("the prompt has no user message to append the instruction to")
    messages = [dict(m) for m in messages]
    content = messages[last_user]["content"]
    if isinstance(content, str):
        messages[last_user]["content"] = f"{content} {instruction}"
    else:  # content parts (images and text): after the last text part, or as a new one
        texts = [i for i, part in enumerate(content) if part.get("type") == "text"]
        content = [dict(part) for part in content]
        if texts:
            content[texts[-1]]["text"] = f"{content[texts[-1]]['text']} {instruction}"
        else:
            content.append({"type": "text", "text": instruction})
        messages[last_user]["content"] = content
    return messages


def _field(row: dict[str, Any], name: str, hint: str = "") -> Any:
    if name not in row:
        raise BadRow(f"missing field {name!r} (fields present: {sorted(row)})" + (f"; {hint}" if hint else ""))
    return row[name]


def _text(value: Any, name: str, hint: str = "") -> str:
    if not isinstance(value, str):
        raise BadRow(f"field {name!r} must be a string, got {_kind(value)}" + (f" ({hint})" if hint else ""))
    if not value.strip():
        raise BadRow(f"field {name!r} is empty")
    return value


def _messages(value: Any, name: str) -> list[dict[str, str]]:
    if value == []:
        raise BadRow(f"{name!r} is an empty list; it needs at least one {{role, content}} message")
    if not isinstance(value, list):
        raise BadRow(f"{name!r} must be a list of {{role, content}} objects, got {_kind(value)}")
    messages = []
    for i, message in enumerate(value):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) \
                or not isinstance(message.get("content"), str):
            raise BadRow(f"{name!r} must be a list of {{role, content}} objects with string values "
                         f"(item {i} is not)")
        messages.append({"role": message["role"], "content": message["content"]})
    return messages


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
