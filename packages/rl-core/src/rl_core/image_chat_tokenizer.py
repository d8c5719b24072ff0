"""A vision-language model's tokenizer for rollouts and evaluation: chats with images go through its processor.

GRPO's rollouts (``rl_algorithms.rollout``), its validation and rl-eval render prompts with
``tokenizer.apply_chat_template`` and decode with ``tokenizer.decode``. ``ImageChatTokenizer(processor)`` is
the model's text tokenizer (every attribute: ``decode``, ``encode``, ``pad_token_id``, ``eos_token_id``, ...)
whose chat template is the processor's, so a chat's image parts render as the model's image placeholders, and
whose ``encode_image_chat(messages)`` gives the prompt to generate from: an ``EncodedChat`` (token ids with each
image's tokens expanded, its image tensors) when the chat holds images, else its token ids.
"""

from __future__ import annotations

from typing import Any

from rl_core.images import message_images
from rl_core.vision_inputs import EncodedChat, encode_chat


class ImageChatTokenizer:
    """``processor.tokenizer`` with the processor's chat template and image-token expansion (see the module doc)."""

    def __init__(self, processor: Any):
        self.processor = processor
        self.tokenizer = processor.tokenizer

    def __getattr__(self, name: str) -> Any:
        if name in ("processor", "tokenizer"):  # not set yet (e.g. while unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.tokenizer, name)

    def __len__(self) -> int:  # special methods skip __getattr__
        return len(self.tokenizer)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.tokenizer(*args, **kwargs)

    @property
    def placeholder_token_ids(self) -> tuple[int, ...]:
        """The ids that stand for image (and video) features in the model's input: never valid model output."""
        ids = (getattr(self.processor, "image_token_id", None), getattr(self.processor, "video_token_id", None))
        return tuple(i for i in ids if i is not None)

    def encode_image_chat(self, messages: list[dict[str, Any]]) -> EncodedChat | list[int]:
        """The generation prompt of ``messages``: an ``EncodedChat`` when they hold images, else token ids."""
        if not message_images(messages):
            return self.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        return encode_chat(self.processor, messages, add_generation_prompt=True)

    def apply_chat_template(self, messages: list[dict[str, Any]], *, tokenize: bool = True,
                            add_generation_prompt: bool = False, **kwargs: Any) -> str | list[int]:
        """The processor's rendering; tokenized, a chat's images count as all their tokens."""
        if not tokenize:
            return self.processor.apply_chat_template(messages, tokenize=False,
                                                      add_generation_prompt=add_generation_prompt, **kwargs)
        return encode_chat(self.processor, messages, add_generation_prompt=add_generation_prompt).input_ids


def chat_tokenizer(model_path: str, tokenizer: Any) -> Any:
    """``tokenizer``, or for a vision-language model the ``ImageChatTokenizer`` of its processor."""
    from rl_core.models.processor import is_vision_language_model, load_processor

    return ImageChatTokenizer(load_processor(model_path)) if is_vision_language_model(model_path) else tokenizer
