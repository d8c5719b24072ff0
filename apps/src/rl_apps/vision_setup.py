"""Runs whose model is a vision-language model (`rl grpo`, `rl eval`): the checks made before anything is written,
and the tokenizer that renders chats with images through the model's processor (``rl_core.image_chat_tokenizer``)."""

from __future__ import annotations

from typing import Any

from rl_core.config import ConfigError, ConfigProblem
from rl_core.image_chat_tokenizer import ImageChatTokenizer
from rl_core.models.processor import is_vision_language_model, load_processor

IMAGE_GENERATION_BACKENDS = ("native", "hf")
"""Generation backends that take prompts with images (vLLM, SGLang and Megatron decoding take text only)."""


def image_chat_tokenizer(model_path: str, tokenizer: Any, *, generation_backend: str, policy: Any = None) -> Any:
    """``tokenizer`` for a text model; for a vision-language model, after checking that ``generation_backend`` (and
    the training backend of ``policy``, when training) handle images, its ``ImageChatTokenizer``. Raises
    ConfigError naming the key to change."""
    if not is_vision_language_model(model_path):
        return tokenizer
    if generation_backend not in IMAGE_GENERATION_BACKENDS:
        raise ConfigError(ConfigProblem("config", "generation.backend", (
            f"{generation_backend!r} takes text prompts only, but {model_path} is a vision-language model; use "
            f"one of {list(IMAGE_GENERATION_BACKENDS)} (the native engine runs the vision tower at prefill)")))
    if policy is not None:
        from rl_backends_train.vision import check_vision_support

        try:
            check_vision_support(policy, model_path)
        except ValueError as e:
            raise ConfigError(ConfigProblem("config", "policy", str(e))) from None
    return ImageChatTokenizer(load_processor(model_path))
