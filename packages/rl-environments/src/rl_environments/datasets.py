"""Prompt files (JSONL / JSON / parquet) as ``PromptSample``s, every row checked.

A row is bad when a field is missing, the prompt is not a non-empty string (a chat goes in
``messages_field``), the messages are not a list of ``{role, content}`` strings, or the answer is null
or not a string / number; the caller's ``check`` may refuse more (a prompt longer than its token
budget). Bad rows stop the load with the file and row named, or are skipped and counted
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
                     section: str = "data") -> Loaded[PromptSample]:
    """PromptSamples from a file, with the field mapping of ``cfg``; each also passes ``check``.
    ``section``: the config section of ``cfg`` (named in errors)."""

    def convert(row: dict[str, Any]) -> PromptSample:
        sample = record_to_sample(row, cfg)
        if check is not None:
            check(sample)
        return sample

    return load_rows(path, convert, on_bad_row=cfg.on_bad_row, file_format=cfg.format, section=section)


def record_to_sample(row: dict[str, Any], cfg: PromptFieldsConfig) -> PromptSample:
    """One row as a PromptSample; raises :class:`~rl_core.data_files.BadRow` for a row it cannot use."""
    if cfg.messages_field:
        messages = _messages(_field(row, cfg.messages_field), cfg.messages_field)
    else:
        question = _text(_field(row, cfg.prompt_field), cfg.prompt_field, "a chat goes in messages_field")
        if cfg.instruction:
            question = f"{question} {cfg.instruction}"
        messages = [{"role": "user", "content": question}]
    if cfg.system_prompt and not any(m["role"] == "system" for m in messages):
        messages.insert(0, {"role": "system", "content": cfg.system_prompt})
    metadata = {name: _field(row, name) for name in cfg.metadata_fields}
    if cfg.answer_field:
        answer = _field(row, cfg.answer_field)
        if answer is None or isinstance(answer, bool) or not isinstance(answer, str | int | float):
            raise BadRow(f"field {cfg.answer_field!r} must be a string or a number, got {_kind(answer)}")
        metadata["answer"] = str(answer)
    return PromptSample(messages=messages, metadata=metadata, env=getattr(cfg, "env", None))


def _field(row: dict[str, Any], name: str) -> Any:
    if name not in row:
        raise BadRow(f"missing field {name!r} (fields present: {sorted(row)})")
    return row[name]


def _text(value: Any, name: str, hint: str = "") -> str:
    if not isinstance(value, str):
        raise BadRow(f"field {name!r} must be a string, got {_kind(value)}" + (f" ({hint})" if hint else ""))
    if not value.strip():
        raise BadRow(f"field {name!r} is empty")
    return value


def _messages(value: Any, name: str) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
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
