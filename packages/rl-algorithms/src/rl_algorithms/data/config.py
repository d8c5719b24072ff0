"""Config sections of the dataset loaders (``data:`` in the SFT, DPO, RM and distillation recipes)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rl_core.config import StrictModel
from rl_core.data_files import BadRowPolicy, FileFormat


class DataFileConfig(StrictModel):
    """Where the rows are and what to do with rows that cannot be used."""

    train_path: str | None = None
    """A ``.jsonl`` (one JSON object per line), ``.json`` (a list of objects) or ``.parquet`` file of
    training rows, or a ``datasets`` ``save_to_disk`` directory (of a DatasetDict: its ``train`` split, or
    name one as ``<dir>/<split>``). The commands' ``synthetic_data`` section can generate one instead."""
    validation_path: str | None = None
    """Held-out rows in the same forms (a DatasetDict: its ``validation`` split; None: no validation)."""
    format: FileFormat = "auto"
    """``auto``: a directory is a ``datasets`` directory, a file goes by its extension (``.jsonl``, ``.json``,
    ``.parquet``)."""
    max_length: int = Field(1024, gt=1)
    """Most tokens of one tokenised sample (prompt + response). Longer rows are bad rows."""
    on_bad_row: BadRowPolicy = "error"
    """``error``: stop with a message naming the file and row. ``skip``: drop the row and count it."""


class ChatDataConfig(DataFileConfig):
    """Supervised rows, TRL's layouts: a chat (``messages``) or a prompt/completion pair, plain or
    conversational; loss on assistant tokens only."""

    row_format: Literal["auto", "messages", "prompt_response"] = "auto"
    """``auto``: rows holding ``messages_key`` are chats, the others prompt/completion pairs."""
    messages_key: str = "messages"
    """Field holding a list of ``{"role", "content"}`` messages."""
    prompt_key: str = "prompt"
    """Field holding the prompt: a string (one user message) or a list of messages."""
    response_key: str = "completion"
    """Field holding the response: a string (one assistant message) or a list of assistant messages.
    Rows without it may use ``response`` while this is left at ``completion``."""
    images_key: str = "images"
    """Vision-language models: field holding a row's images (a path relative to the file, a ``data:`` URL,
    bytes, or a list of them), filling the ``{"type": "image"}`` placeholders of its messages in order, or
    put before the prompt's text in a prompt row (docs/vlm.md)."""
    system_prompt: str | None = None
    """A system message put first when a row has none."""
    train_on: Literal["all_assistant", "last_assistant"] = "all_assistant"
    """Which assistant turns of a chat carry loss."""
    use_chat_template: bool = True
    """False: plain ``prompt + response + eos`` text (for base models without a chat template)."""


class PreferenceDataConfig(DataFileConfig):
    """Preference pairs, TRL's layouts: a prompt, a chosen and a rejected response, plain or
    conversational (DPO, reward models)."""

    prompt_key: str = "prompt"
    """Field holding the prompt: a string (one user message) or a list of messages. Conversational rows
    without it (an implicit prompt) use the messages that ``chosen`` and ``rejected`` share."""
    chosen_key: str = "chosen"
    """Field holding the preferred response: a string or a list of assistant message(s)."""
    rejected_key: str = "rejected"
    """Field holding the other response, in the same layout as ``chosen_key``."""
    system_prompt: str | None = None
    """A system message put first when a prompt has none."""
    use_chat_template: bool = True
    """False: plain ``prompt + response + eos`` text."""


class TextDataConfig(DataFileConfig):
    """Plain text rows (cross-tokenizer distillation)."""

    text_key: str = "text"
    """Field holding the text."""


class PromptDataConfig(DataFileConfig):
    """Prompts only (on-policy distillation): the policy writes the responses."""

    prompt_key: str = "prompt"
    """Field holding the prompt: a string (one user message) or a list of messages."""
    system_prompt: str | None = None
    """A system message put first when a prompt has none."""
