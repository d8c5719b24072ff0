"""Runs whose model is a vision-language model (`rl grpo`): the tokenizer that renders chats with images through
the model's processor (``rl_core.image_chat_tokenizer``)."""

from __future__ import annotations

from typing import Any

from rl_core.image_chat_tokenizer import ImageChatTokenizer
from rl_core.models.processor import is_vision_language_model, load_processor


def image_chat_tokenizer(model_path: str, tokenizer: Any) -> Any:
    """``tokenizer`` for a text model; for a vision-language model its ``ImageChatTokenizer`` (``start_run`` has
    checked that the generation and training backends take images: ``check_generation`` / ``check_training``)."""
    if not is_vision_language_model(model_path):
        return tokenizer
    return ImageChatTokenizer(load_processor(model_path))
