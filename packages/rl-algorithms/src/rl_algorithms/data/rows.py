"""Turn decoded records into samples: chats with the turns that carry loss, or plain prompt/response text.

The layouts are TRL's: ``messages`` chats; ``prompt`` / ``completion`` pairs; ``prompt`` / ``chosen`` /
``rejected`` preference rows (with an explicit or an implicit prompt); each plain (strings) or
conversational (lists of ``{role, content}`` messages).

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


RESPONSE_ALIASES = {"completion": ("response",)}
"""Fields read when a row lacks the default response field (``response`` was the default before TRL's name)."""


def parse_chat_row(record: dict[str, Any], cfg: ChatDataConfig) -> Sample:
    """An SFT sample from a ``messages`` row or a prompt/completion row (TRL's layouts, plain or
    conversational)."""
    row_format = cfg.row_format
    if row_format == "auto":
        row_format = "messages" if cfg.messages_key in record else "prompt_response"
    if row_format == "messages":
        if not cfg.use_chat_template:
            raise BadRow("chat rows need the chat template (data.use_chat_template=true)")
        value = _field(record, cfg.messages_key, "data.messages_key")
        messages = _add_system(_messages(value, cfg.messages_key), cfg.system_prompt)
        assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        if not assistant:
            raise BadRow(f"field {cfg.messages_key!r} has no assistant message to train on")
        trainable = assistant if cfg.train_on == "all_assistant" else assistant[-1:]
        for i in trainable:
            _require_text(messages[i]["content"], f"{cfg.messages_key}[{i}].content (an assistant response)")
        return ChatSample(messages, trainable)
    key = _present_key(record, cfg.response_key, RESPONSE_ALIASES)
    value = _field(record, key, "data.response_key",
                   "" if cfg.row_format == "prompt_response" else " (for chat rows: data.messages_key)")
    prompt = _field(record, cfg.prompt_key, "data.prompt_key")
    return _prompt_and_response(prompt, cfg.prompt_key, value, key, cfg.system_prompt, cfg.use_chat_template)


def parse_preference_row(record: dict[str, Any], cfg: PreferenceDataConfig) -> tuple[Sample, Sample]:
    """``(chosen, rejected)`` samples sharing the row's prompt, which is explicit (``prompt_key``) or, for
    conversational rows without it, the messages both responses start with."""
    chosen = _field(record, cfg.chosen_key, "data.chosen_key")
    rejected = _field(record, cfg.rejected_key, "data.rejected_key")
    if cfg.prompt_key not in record and isinstance(chosen, list) and isinstance(rejected, list):
        return _implicit_prompt_pair(chosen, rejected, cfg)
    prompt = _field(record, cfg.prompt_key, "data.prompt_key")
    return (_prompt_and_response(prompt, cfg.prompt_key, chosen, cfg.chosen_key, cfg.system_prompt,
                                 cfg.use_chat_template),
            _prompt_and_response(prompt, cfg.prompt_key, rejected, cfg.rejected_key, cfg.system_prompt,
                                 cfg.use_chat_template))


def parse_prompt(record: dict[str, Any], key: str, system_prompt: str | None) -> list[Message]:
    """The prompt messages of a row (a string becomes one user message)."""
    return _prompt_messages(_field(record, key, "data.prompt_key"), key, system_prompt)


def parse_text_row(record: dict[str, Any], cfg: TextDataConfig) -> str:
    text = _string(_field(record, cfg.text_key, "data.text_key"), cfg.text_key)
    _require_text(text, cfg.text_key)
    return text


def _prompt_and_response(prompt: Any, prompt_key: str, response: Any, response_key: str,
                         system_prompt: str | None, use_chat_template: bool) -> Sample:
    """A prompt (string or messages) and its response: a string (one assistant message) or a list of
    messages that continue the prompt (loss on their assistant messages)."""
    if isinstance(response, list):
        if not use_chat_template:
            raise BadRow(f"field {response_key!r} holds messages; they need data.use_chat_template=true")
        return _continued(_prompt_messages(prompt, prompt_key, system_prompt), _messages(response, response_key),
                          response_key)
    text = _string(response, response_key)
    _require_text(text, response_key)
    if not use_chat_template:
        return PlainSample(_string(prompt, prompt_key), text)
    return _continued(_prompt_messages(prompt, prompt_key, system_prompt), [{"role": "assistant", "content": text}],
                      response_key)


def _continued(prompt: list[Message], continuation: list[Message], key: str) -> ChatSample:
    """``prompt + continuation``, trained on the continuation's assistant messages."""
    assistant = [i for i, m in enumerate(continuation) if m["role"] == "assistant"]
    if not assistant:
        raise BadRow(f"field {key!r} has no assistant message")
    for i in assistant:
        _require_text(continuation[i]["content"], f"{key} (an assistant response)")
    return ChatSample(prompt + continuation, [len(prompt) + i for i in assistant])


def _implicit_prompt_pair(chosen: Any, rejected: Any, cfg: PreferenceDataConfig) -> tuple[Sample, Sample]:
    """TRL's implicit-prompt preference rows: two whole conversations; the prompt is what they share."""
    if not cfg.use_chat_template:
        raise BadRow(f"field {cfg.chosen_key!r} holds messages; they need data.use_chat_template=true")
    chosen_messages, rejected_messages = _messages(chosen, cfg.chosen_key), _messages(rejected, cfg.rejected_key)
    shared = 0
    while (shared < min(len(chosen_messages), len(rejected_messages))
           and chosen_messages[shared] == rejected_messages[shared]):
        shared += 1
    if shared == 0:
        raise BadRow(f"no field {cfg.prompt_key!r}, and {cfg.chosen_key!r} and {cfg.rejected_key!r} start with "
                     "different messages, so there is no shared prompt; set data.prompt_key to the prompt's field")
    prompt = _add_system(chosen_messages[:shared], cfg.system_prompt)
    return (_continued(prompt, chosen_messages[shared:], cfg.chosen_key),
            _continued(prompt, rejected_messages[shared:], cfg.rejected_key))


def _prompt_messages(value: Any, key: str, system_prompt: str | None) -> list[Message]:
    if isinstance(value, str):
        _require_text(_string(value, key), key)
        return _add_system([{"role": "user", "content": value}], system_prompt)
    messages = _add_system(_messages(value, key), system_prompt)
    if not messages:
        raise BadRow(f"field {key!r} is an empty list of messages")
    return messages


def _present_key(record: dict[str, Any], key: str, aliases: dict[str, tuple[str, ...]]) -> str:
    """``key``, or an alias of it that the row has instead."""
    if key in record:
        return key
    return next((alias for alias in aliases.get(key, ()) if alias in record), key)


def _add_system(messages: list[Message], system_prompt: str | None) -> list[Message]:
    if system_prompt is None or (messages and messages[0]["role"] == "system"):
        return messages
    return [{"role": "system", "content": system_prompt}, *messages]


def _field(record: dict[str, Any], key: str, setting: str, also: str = "") -> Any:
    """``record[key]``; a missing field names the config key (``setting``) that says where it is."""
    if record.get(key, "") is None:  # JSON null, or an empty cell of a parquet / datasets column
        raise BadRow(f"field {key!r} is null")
    if key not in record:
        present = ", ".join(repr(k) for k in record) or "none"
        raise BadRow(f"missing field {key!r} (fields present: {present}); set {setting} to the field that "
                     f"holds it{also}")
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
