"""Load and tokenise whole datasets, applying the ``on_bad_row`` policy in one place."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from rl_algorithms.data.config import (
    ChatDataConfig,
    DataFileConfig,
    PreferenceDataConfig,
    PromptDataConfig,
    TextDataConfig,
)
from rl_algorithms.data.rows import parse_chat_row, parse_preference_row, parse_prompt, parse_text_row
from rl_algorithms.data.tokenize import TokenizedSample, prompt_token_ids, tokenize_sample
from rl_core import data_files
from rl_core.data_files import BadRow, DataError, Loaded

T = TypeVar("T")


def load_rows(path: str | None, cfg: DataFileConfig, convert: Callable[[dict[str, Any]], T]) -> Loaded[T]:
    """Read ``path`` and ``convert`` each record; bad rows raise :class:`DataError` or are skipped
    (``cfg.on_bad_row``), see :func:`rl_core.data_files.load_rows`."""
    if path is None:
        raise DataError("no dataset file given: set data.train_path (or use the command's synthetic_data section)")
    return data_files.load_rows(path, convert, on_bad_row=cfg.on_bad_row, file_format=cfg.format,
                                split=_split_of(path, cfg))


def _split_of(path: str, cfg: DataFileConfig) -> str | None:
    """The split a saved DatasetDict at ``path`` gives: that of the path's role (train / validation)."""
    roles = [split for split, role_path in (("train", cfg.train_path), ("validation", cfg.validation_path))
             if role_path == path]
    if len(roles) == 2 and Path(path).is_dir() and (Path(path) / "dataset_dict.json").is_file():
        raise DataError(f"{path}: data.train_path and data.validation_path name the same DatasetDict directory; "
                        f"name a split in each: data.train_path={Path(path) / 'train'} "
                        f"data.validation_path={Path(path) / 'validation'}")
    return roles[0] if roles else None


def load_chat_dataset(path: str, cfg: ChatDataConfig, tokenizer) -> Loaded[TokenizedSample]:
    """SFT samples: chats or prompt/response rows, loss on assistant tokens."""
    return load_rows(path, cfg, lambda record: tokenize_sample(tokenizer, parse_chat_row(record, cfg), cfg.max_length))


def load_preference_dataset(path: str, cfg: PreferenceDataConfig,
                            tokenizer) -> Loaded[tuple[TokenizedSample, TokenizedSample]]:
    """``(chosen, rejected)`` tokenised pairs; a pair is bad if either side is."""

    def convert(record: dict[str, Any]) -> tuple[TokenizedSample, TokenizedSample]:
        chosen, rejected = parse_preference_row(record, cfg)
        return tokenize_sample(tokenizer, chosen, cfg.max_length), tokenize_sample(tokenizer, rejected, cfg.max_length)

    return load_rows(path, cfg, convert)


def load_prompt_dataset(path: str, cfg: PromptDataConfig, tokenizer) -> Loaded[list[int]]:
    """Prompt token ids (chat template with the generation prompt), for on-policy generation."""

    def convert(record: dict[str, Any]) -> list[int]:
        ids = prompt_token_ids(tokenizer, parse_prompt(record, cfg.prompt_key, cfg.system_prompt))
        if len(ids) > cfg.max_length:
            raise BadRow(f"{len(ids)} prompt tokens, longer than data.max_length={cfg.max_length}")
        return ids

    return load_rows(path, cfg, convert)


def load_text_dataset(path: str, cfg: TextDataConfig, tokenizers: list = ()) -> Loaded[str]:
    """Plain texts; a text longer than ``max_length`` tokens under any of ``tokenizers`` is a bad row."""

    def convert(record: dict[str, Any]) -> str:
        text = parse_text_row(record, cfg)
        for tokenizer in tokenizers:
            n = len(tokenizer(text, add_special_tokens=False)["input_ids"])
            if n > cfg.max_length:
                raise BadRow(f"{n} tokens, longer than data.max_length={cfg.max_length}")
        return text

    return load_rows(path, cfg, convert)
