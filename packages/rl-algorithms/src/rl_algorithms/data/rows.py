"""Turn decoded records into samples: chats with the turns that carry loss, or plain prompt/response text.

Every check raises :class:`BadRow` with a short reason; the loader adds the file and row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rl_algorithms.data.config import ChatDataConfig, PreferenceDataConfig, TextDataConfig
from rl_core.data_files import BadRow

Message = dict[str, str]


@dataclass
class ChatSample:
    """A conversation rendered with the chat template; loss on the assistant messages in ``trainable``."""

    messages: list[Message]
    trainable: list[int] = field(default_factory=list)
    """Indices into ``messages`` (assistant messages only)."""


@dataclass
class PlainSample:
    """``prompt + response`` as plain text (no chat template); loss on the response and the eos token."""

    prompt: str
    response: str


Sample = ChatSample | PlainSample


def parse_chat_row(record: dict[str, Any], cfg: ChatDataConfig) -> Sample:
    """An SFT sample from a ``messages`` row or a prompt/response row."""
    row_format = cfg.row_format
    if row_format == "auto":
        row_format = "messages" if cfg.messages_key in record else "prompt_response"
    if row_format == "messages":
        if not cfg.use_chat_template:
            raise BadRow("chat rows need the chat template (data.use_chat_template=true)")
        messages = _add_system(_messages(_field(record, cfg.messages_key), cfg.messages_key), cfg.system_prompt)
        assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        if not assistant:
            raise BadRow(f"field {cfg.messages_key!r} has no assistant message to train on")
        trainable = assistant if cfg.train_on == "all_assistant" else assistant[-1:]
        for i in trainable:
            _require_text(messages[i]["content"], f"{cfg.messages_key}[{i}].content (an assistant response)")
        return ChatSample(messages, trainable)
    response = _string(_field(record, cfg.response_key), cfg.response_key)
    _require_text(response, cfg.response_key)
    return _prompt_response(record, cfg.prompt_key, cfg.response_key, response, cfg.system_prompt,
                            cfg.use_chat_template)


def parse_preference_row(record: dict[str, Any], cfg: PreferenceDataConfig) -> tuple[Sample, Sample]:
    """``(chosen, rejected)`` samples sharing the row's prompt."""
    pair = []
    for key in (cfg.chosen_key, cfg.rejected_key):
        value = _field(record, key)
        if isinstance(value, list):  # conversational: assistant message(s) that follow the prompt
            if not cfg.use_chat_template:
                raise BadRow(f"field {key!r} holds messages; they need data.use_chat_template=true")
            prompt = _prompt_messages(_field(record, cfg.prompt_key), cfg.prompt_key, cfg.system_prompt)
            continuation = _messages(value, key)
            if not any(m["role"] == "assistant" for m in continuation):
                raise BadRow(f"field {key!r} has no assistant message")
            for m in continuation:
                if m["role"] == "assistant":
                    _require_text(m["content"], f"{key} (an assistant response)")
            messages = prompt + continuation
            trainable = [i for i in range(len(prompt), len(messages)) if messages[i]["role"] == "assistant"]
            pair.append(ChatSample(messages, trainable))
        else:
            response = _string(value, key)
            _require_text(response, key)
            pair.append(_prompt_response(record, cfg.prompt_key, key, response, cfg.system_prompt,
                                         cfg.use_chat_template))
    return pair[0], pair[1]


def parse_prompt(record: dict[str, Any], key: str, system_prompt: str | None) -> list[Message]:
    """The prompt messages of a row (a string becomes one user message)."""
    return _prompt_messages(_field(record, key), key, system_prompt)


def parse_text_row(record: dict[str, Any], cfg: TextDataConfig) -> str:
    text = _string(_field(record, cfg.text_key), cfg.text_key)
    _require_text(text, cfg.text_key)
    return text


def _prompt_response(record: dict[str, Any], prompt_key: str, response_key: str, response: str,
                     system_prompt: str | None, use_chat_template: bool) -> Sample:
    prompt_value = _field(record, prompt_key)
    if not use_chat_template:
        return PlainSample(_string(prompt_value, prompt_key), response)
    prompt = _prompt_messages(prompt_value, prompt_key, system_prompt)
    messages = prompt + [{"role": "assistant", "content": response}]
    return ChatSample(messages, [len(messages) - 1])


def _prompt_messages(value: Any, key: str, system_prompt: str | None) -> list[Message]:
    if isinstance(value, str):
        _require_text(_string(value, key), key)
        return _add_system([{"role": "user", "content": value}], system_prompt)
    messages = _add_system(_messages(value, key), system_prompt)
    if not messages:
        raise BadRow(f"field {key!r} is an empty list of messages")
    return messages


def _add_system(messages: list[Message], system_prompt: str | None) -> list[Message]:
    if system_prompt is None or (messages and messages[0]["role"] == "system"):
        return messages
    return [{"role": "system", "content": system_prompt}, *messages]


def _field(record: dict[str, Any], key: str) -> Any:
    if key not in record or record[key] is None:
        present = ", ".join(repr(k) for k in record) or "none"
        raise BadRow(f"missing field {key!r} (fields present: {present})")
    return record[key]


def _string(value: Any, key: str) -> str:
    if not isinstance(value, str):
        raise BadRow(f"field {key!r} must be a string, got {type(value).__name__}")
    _check_utf8(value, key)
    return value


def _messages(value: Any, key: str) -> list[Message]:
    if not isinstance(value, list):
        raise BadRow(f"field {key!r} must be a list of messages, got {type(value).__name__}")
    out = []
    for i, message in enumerate(value):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise BadRow(f"{key}[{i}] must be an object with 'role' and 'content'")
        role, content = message["role"], message["content"]
        if not isinstance(role, str) or not isinstance(content, str):
            raise BadRow(f"{key}[{i}]: 'role' and 'content' must be strings")
        _check_utf8(content, f"{key}[{i}].content")
        out.append({"role": role, "content": content})
    return out


def _require_text(text: str, what: str) -> None:
    if not text.strip():
        raise BadRow(f"{what} is empty")


def _check_utf8(text: str, what: str) -> None:
    """JSON may smuggle lone surrogates (``"\\ud800"``) that no tokenizer can encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise BadRow(f"{what} is not valid UTF-8 (lone surrogate at character {e.start})") from None
