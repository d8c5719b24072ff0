"""Checks on generation requests, shared by every backend: bad input fails before any work starts."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rl_core.protocols import Prompt
from rl_core.types import SamplingParams
from rl_core.vision_inputs import EncodedChat


def validate_sampling(sampling: SamplingParams, *, has_tokenizer: bool = True) -> None:
    """Raise ValueError for impossible sampling settings (wrong container types included)."""
    if not isinstance(sampling, SamplingParams):
        raise ValueError(f"sampling must be an rl_core.types.SamplingParams, got {type(sampling).__name__}")
    for field in ("stop_strings", "stop_token_ids"):
        value = getattr(sampling, field)
        if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)):
            raise ValueError(
                f"{field} must be a tuple, got {type(value).__name__} {value!r}; e.g. {field}=({value!r},)"
            )
    for name in ("max_new_tokens", "top_k", "n"):
        value = getattr(sampling, name)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    sampling.validate()
    if sampling.stop_strings and not has_tokenizer:
        raise ValueError("stop_strings need a tokenizer to decode text; pass tokenizer=... to the backend")


def validate_prompts(prompts: Sequence[Prompt], *, vocab_size: int, max_seq_len: int | None,
                     backend: str | None = None) -> list[list[int]]:
    """Return the prompts' token ids as lists of ints (an ``EncodedChat``'s ``input_ids``), or raise ValueError
    naming the bad prompt. A ``backend`` named here takes text only: a prompt with images is refused, never
    generated without its images."""
    if isinstance(prompts, (str, bytes)):
        raise ValueError("prompts must be a list of token-id lists, got a string; tokenize it first")
    checked = []
    for index, prompt in enumerate(prompts):
        if isinstance(prompt, EncodedChat):
            if backend is not None and prompt.has_images:
                raise ValueError(f"prompt {index} holds images but the {backend} backend takes text prompts only; "
                                 "use generation.backend: native (or hf) for a vision-language model")
            prompt = prompt.input_ids
        if isinstance(prompt, (str, bytes)):
            raise ValueError(f"prompt {index} is a string; prompts must be token ids (tokenize first)")
        ids = prompt.tolist() if isinstance(prompt, torch.Tensor) else list(prompt)
        if not ids:
            raise ValueError(f"prompt {index} is empty; every prompt needs at least one token")
        for token in ids:
            if not isinstance(token, int) or isinstance(token, bool) or not 0 <= token < vocab_size:
                raise ValueError(f"prompt {index} holds {token!r}, not a token id in [0, {vocab_size})")
        if max_seq_len is not None and len(ids) >= max_seq_len:
            raise ValueError(
                f"prompt {index} has {len(ids)} tokens but the context holds {max_seq_len} (max_seq_len), "
                "with room for at least one new token; shorten the prompt or raise max_seq_len"
            )
        checked.append(ids)
    return checked


def default_stop_token_ids(tokenizer, model_config, generation_config=None) -> tuple[int, ...]:
    """The end-of-sequence ids of the tokenizer, the model config and its generation config."""
    found: list[int] = []
    sources = [getattr(tokenizer, "eos_token_id", None), getattr(model_config, "eos_token_id", None),
               getattr(generation_config, "eos_token_id", None)]
    for value in sources:
        for token in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(token, int) and token not in found:
                found.append(token)
    return tuple(found)


def image_prompts(prompts: Sequence[Prompt]) -> list[EncodedChat | None] | None:
    """Each prompt's ``EncodedChat`` when it has images (else None); None when no prompt has images."""
    found = [p if isinstance(p, EncodedChat) and p.has_images else None for p in prompts]
    return found if any(p is not None for p in found) else None
