"""Image tensors per sequence, and their batching: what a trainer or an engine hands a VLM's forward.

A VLM's forward takes the token tensors (``input_ids``, ``attention_mask``, for Qwen-VL also
``mm_token_type_ids``: 1 on image tokens, 0 elsewhere) and the processor's image tensors. Batches are cut
into micro-batches and shards by sequence, so each sequence keeps its own image tensors
(:func:`encode_chat`) and :func:`collate_image_inputs` joins those of any subset of sequences, in order:

- ``flat`` layout (Qwen2.5-VL, Qwen3-VL: ``pixel_values [patches, D]``, ``image_grid_thw [images, 3]``):
  the sequences' tensors are concatenated along dim 0; the model finds each image's tokens in
  ``input_ids`` in the same order.
- ``batched`` layout (Idefics3 / SmolVLM: ``pixel_values [1, images, 3, H, W]``, ``pixel_attention_mask
  [1, images, H, W]``): the sequences' tensors are padded with zero images to the most images of any
  sequence and stacked; the model skips all-zero images.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from rl_core.images import message_images

TOKEN_KEYS = ("input_ids", "attention_mask", "mm_token_type_ids", "token_type_ids")
"""Processor outputs aligned with the tokens (padded with the tokens, not collated as image tensors)."""
Layout = Literal["flat", "batched"]


@dataclass
class EncodedChat:
    """One chat rendered with its chat template and run through the processor: a training row's inputs, and a
    prompt of ``GenerationBackend.generate`` (``rl_core.protocols.Prompt``) with its images."""

    input_ids: list[int]
    image_inputs: dict[str, torch.Tensor]
    """This sequence's image tensors as the processor returns them for it alone (empty without images)."""
    mm_token_type_ids: list[int] | None = None
    """Qwen-VL: 1 on image tokens, 0 elsewhere (tokens appended later are 0); None for other families."""
    images: list[Any] = field(default_factory=list)
    """The chat's images (PIL) in order, for engines that run the processor themselves (vLLM's multi-modal data)."""

    @property
    def has_images(self) -> bool:
        return bool(self.image_inputs)


def encode_chat(processor: Any, messages: list[dict[str, Any]], *, add_generation_prompt: bool = False) -> EncodedChat:
    """Render ``messages`` (content parts may hold PIL images, see :mod:`rl_core.images`) and process them."""
    text = processor.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)
    images = message_images(messages)
    out = processor(text=[text], images=[images] if images else None, return_tensors="pt")
    token_types = out.get("mm_token_type_ids")
    return EncodedChat(
        input_ids=out["input_ids"][0].tolist(),
        image_inputs={k: v for k, v in out.items() if k not in TOKEN_KEYS},
        mm_token_type_ids=None if token_types is None else token_types[0].tolist(),
        images=images,
    )


def image_layout(image_inputs: dict[str, torch.Tensor]) -> Layout:
    """``batched`` when pixel values carry a batch and an image dim (5-D), else ``flat``."""
    pixels = image_inputs.get("pixel_values")
    return "batched" if pixels is not None and pixels.dim() == 5 else "flat"


def collate_image_inputs(per_sequence: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The image tensors of several sequences as one forward's keyword arguments (see the module doc).
    A sequence without images adds nothing (flat) or only zero images (batched); ``{}``: no images at all."""
    present = [inputs for inputs in per_sequence if inputs]
    if not present:
        return {}
    layouts = {image_layout(inputs) for inputs in present}
    if len(layouts) > 1:
        raise ValueError("image inputs of one batch mix the flat and batched layouts (two model families?)")
    keys = sorted(present[0])
    for inputs in present:
        if sorted(inputs) != keys:
            raise ValueError(f"image inputs of one batch have different keys: {sorted(inputs)} vs {keys}")
    if layouts == {"flat"}:
        return {key: torch.cat([inputs[key] for inputs in present]) for key in keys}
    # batched: [1, images, ...] per sequence (zero images for a sequence without any) -> [B, max images, ...]
    most = max(inputs["pixel_values"].shape[1] for inputs in present)
    out = {}
    for key in keys:
        example = present[0][key]
        rows = []
        for inputs in per_sequence:
            value = inputs.get(key, example[:, :0])
            pad = torch.zeros((1, most - value.shape[1], *value.shape[2:]), dtype=value.dtype)
            rows.append(torch.cat([value, pad], dim=1))
        out[key] = torch.cat(rows)
    return out
