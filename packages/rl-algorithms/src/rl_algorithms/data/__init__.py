"""Datasets for supervised and preference training: reading, bad-row handling, tokenisation, batches.

* :mod:`rl_core.data_files`: JSONL / JSON / parquet rows with their file and row number, bad-row policy.
* :mod:`.rows`: records -> chats (messages) or plain prompt/response samples, preference pairs, texts.
* :mod:`.tokenize`: chat template + loss masks on assistant tokens, computed from templated prefixes.
* :mod:`.loading`: whole files of each kind, with ``on_bad_row: error | skip``.
* :mod:`.image_chats`: chats with images for vision-language models, through the model's processor.
* :mod:`.collate`: right-padded batches; preference pairs interleaved (rows 2i chosen, 2i+1 rejected).
"""

from rl_algorithms.data.collate import collate_pairs, collate_samples, pad_token_id_of, split_pairs
from rl_algorithms.data.config import (
    ChatDataConfig,
    DataFileConfig,
    PreferenceDataConfig,
    PromptDataConfig,
    TextDataConfig,
)
from rl_algorithms.data.image_chats import load_image_chat_dataset
from rl_algorithms.data.loading import (
    load_chat_dataset,
    load_preference_dataset,
    load_prompt_dataset,
    load_rows,
    load_text_dataset,
)
from rl_algorithms.data.rows import ChatSample, PlainSample, parse_chat_row, parse_preference_row
from rl_algorithms.data.sampler import EpochSampler
from rl_algorithms.data.synthetic import SyntheticDataConfig, synthetic_rows, write_jsonl, write_synthetic_dataset
from rl_algorithms.data.tokenize import TokenizedSample, prompt_token_ids, render_chat, tokenize_sample
from rl_core.data_files import BadRow, DataError, Loaded, LoadReport

__all__ = [
    "BadRow",
    "ChatDataConfig",
    "ChatSample",
    "DataError",
    "DataFileConfig",
    "EpochSampler",
    "LoadReport",
    "Loaded",
    "PlainSample",
    "PreferenceDataConfig",
    "PromptDataConfig",
    "TextDataConfig",
    "TokenizedSample",
    "collate_pairs",
    "collate_samples",
    "load_chat_dataset",
    "load_image_chat_dataset",
    "load_preference_dataset",
    "load_prompt_dataset",
    "load_rows",
    "load_text_dataset",
    "pad_token_id_of",
    "parse_chat_row",
    "parse_preference_row",
    "prompt_token_ids",
    "render_chat",
    "split_pairs",
    "SyntheticDataConfig",
    "synthetic_rows",
    "write_jsonl",
    "write_synthetic_dataset",
    "tokenize_sample",
]
