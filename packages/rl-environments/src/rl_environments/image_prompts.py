"""Prompt files whose rows hold images (``images_field`` set), for a vision-language model.

Rows are read by :mod:`rl_core.image_files` (JSONL / JSON with paths relative to the file or ``data:`` URLs,
parquet image bytes, ``datasets`` ``Image`` features) and turned into chats by :func:`rl_core.images.row_to_chat`:
a prompt row's images come before its text in one user turn; a ``messages_field`` chat keeps its image parts
(``{"type": "image"}`` placeholders filled from ``images_field`` in order). Instruction, system prompt,
metadata and answer are those of a text prompt file (:func:`rl_environments.datasets.prompt_sample`). A missing
or undecodable image is a bad row naming the file, the row and the image.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rl_core.data_files import Loaded, convert_rows
from rl_core.image_files import read_image_rows
from rl_core.images import row_to_chat
from rl_core.types import PromptSample
from rl_environments.config import PromptFieldsConfig
from rl_environments.dataset_base import PromptCheck


def load_image_prompt_file(path: str | Path, cfg: PromptFieldsConfig, check: PromptCheck | None = None, *,
                           section: str = "data", split: str | None = None) -> Loaded[PromptSample]:
    """PromptSamples with images from a file or a ``datasets`` directory; each also passes ``check``."""
    from rl_environments.datasets import _prompt_field, prompt_sample

    base_dir = Path(path).parent if Path(path).is_file() else Path(path)

    def convert(row: dict[str, Any]) -> PromptSample:
        messages, _ = row_to_chat(row, base_dir, messages_field=cfg.messages_field or "",
                                  prompt_field=_prompt_field(row, cfg.prompt_field), images_field=cfg.images_field)
        sample = prompt_sample(messages, row, cfg)
        if check is not None:
            check(sample)
        return sample

    return convert_rows(str(path), read_image_rows(path, split=split), convert, on_bad_row=cfg.on_bad_row,
                        section=section)
