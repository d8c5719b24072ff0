"""Prompts with images in the native engine: vision-language models (Qwen2.5-VL, Qwen3-VL, Idefics3 / SmolVLM).

A prompt with images arrives as an ``EncodedChat`` (``rl_core.vision_inputs.encode_chat``: the processor's
token ids, with each image's tokens expanded, and its image tensors). Its prefill runs the model's own inner
forward (``model.model``): the vision tower and projector, the image features scattered into the token
embeddings at the image tokens (Qwen3-VL also adds its DeepStack features in the first decoder layers), then
the language model on the engine's cache. So the vision tower runs once per prompt, in the prefill, and the
prompt's n samples copy its cache rows like those of a text prompt. Decode steps never see an image again.

Positions. Qwen-VL rotates queries and keys by multimodal (M-RoPE) positions: a text token's position is the
same on the time, height and width axes, an image token's comes from its place in the image's patch grid,
and the text after an image continues after the image's largest position, so a prompt's last position is
smaller than its length. ``get_rope_index`` (the model's own) gives the prompt's ``[3, L]`` positions and its
``rope_delta`` = last position + 1 - length; a token at cache index ``p`` after the prompt has rotary
position ``p + rope_delta`` on every axis: the positions the training forward computes for the whole
sequence. Idefics3's language model (Llama) uses plain positions: delta 0.

The vision modules run with SDPA attention; only the language model's attention is the engine's.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from rl_core.models.processor import is_vision_language_model
from rl_core.vision_inputs import EncodedChat, collate_image_inputs


def load_model(model_path: str, dtype: torch.dtype, attention: str) -> nn.Module:
    """The HF model at ``model_path`` with ``attention`` as its language model's attention: a causal LM, or a
    vision-language model (``AutoModelForImageTextToText``) whose vision tower keeps SDPA."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    if not is_vision_language_model(model_path):
        return AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype, attn_implementation=attention)
    return AutoModelForImageTextToText.from_pretrained(
        model_path, dtype=dtype, attn_implementation={"text_config": attention, "vision_config": "sdpa"})


class VisionPrefill:
    """Prefill of prompts with images through the inner forward of ``model`` (see the module doc)."""

    def __init__(self, model: nn.Module):
        self.inner = model.model
        self.image_token_id = model.config.image_token_id
        self.mrope = hasattr(self.inner, "get_rope_index")

    @classmethod
    def of(cls, model: nn.Module) -> VisionPrefill | None:
        """For a vision-language model (its config has a ``vision_config``), else None."""
        return cls(model) if getattr(model.config, "vision_config", None) is not None else None

    def shareable_prefix(self, prompts: Sequence[list[int]]) -> int:
        """Tokens before the first image token of any of ``prompts``: a shared prefix must stop there (image
        tokens of different images have the same id but not the same features)."""
        firsts = [p.index(self.image_token_id) for p in prompts if self.image_token_id in p]
        return min(firsts, default=min(len(p) for p in prompts))

    def positions(self, prompts: Sequence[list[int]], encoded: Sequence[EncodedChat | None], start: int,
                  width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(positions, rope_deltas [P])`` of tokens ``start .. start + width`` of each right-padded prompt:
        ``[3, P, width]`` multimodal positions (Qwen-VL), else ``[P, width]``."""
        device = self.inner.device
        count = len(prompts)
        if not self.mrope:
            return (torch.arange(start, start + width, device=device).expand(count, width),
                    torch.zeros(count, dtype=torch.long, device=device))
        length = max(len(p) for p in prompts)
        ids = torch.zeros(count, length, dtype=torch.long)
        token_types = torch.zeros(count, length, dtype=torch.long)
        real = torch.zeros(count, length, dtype=torch.long)
        for row, (prompt, chat) in enumerate(zip(prompts, encoded)):
            ids[row, : len(prompt)] = torch.tensor(prompt)
            real[row, : len(prompt)] = 1
            if chat is not None and chat.mm_token_type_ids is not None:
                token_types[row, : len(prompt)] = torch.tensor(chat.mm_token_type_ids)
        grids = [chat.image_inputs["image_grid_thw"] for chat in encoded if chat is not None]
        positions, deltas = self.inner.get_rope_index(ids, token_types, image_grid_thw=torch.cat(grids),
                                                      attention_mask=real)
        return positions[:, :, start:start + width].to(device), deltas[:, 0].to(device)

    def prefill(self, prompts: Sequence[list[int]], encoded: Sequence[EncodedChat | None], input_ids: torch.Tensor,
                start: int, step) -> tuple[torch.Tensor, torch.Tensor]:
        """``(hidden [P, width, hidden], rope_deltas [P])`` of the prefill of ``input_ids`` [P, width] (tokens
        ``start ..`` of ``prompts``, right-padded; every image token at or after ``start``), attention routed
        through ``step``."""
        positions, deltas = self.positions(prompts, encoded, start, input_ids.shape[1])
        device = input_ids.device
        images = {key: value.to(device) for key, value in
                  collate_image_inputs([chat.image_inputs if chat is not None else {} for chat in encoded]).items()}
        out = self.inner(input_ids=input_ids, position_ids=positions, use_cache=False, rl_step=step, **images)
        return out.last_hidden_state, deltas
