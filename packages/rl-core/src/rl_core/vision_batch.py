"""Image tensors inside a training :data:`~rl_core.batch.Batch`: one row per sequence, like every other key.

A batch is cut by rows (micro-batches, data-parallel shards, length sorting), so each sequence's image
tensors sit in its own row, zero-padded to the batch's largest (:func:`image_rows`), and
:func:`forward_image_inputs` turns any subset of rows back into one forward's keyword arguments:

- ``flat`` layout (Qwen2.5-VL, Qwen3-VL): ``pixel_values [B, P, D]`` (row i: its images' patches, then
  zeros) and ``image_grid_thw [B, I, 3]`` (row i: the (t, h, w) patch grid of each of its images, then
  zero rows). A row's patch count is the sum of t * h * w over its grid rows, so no other count is kept.
- ``batched`` layout (Idefics3 / SmolVLM): ``pixel_values [B, I, 3, H, W]`` and ``pixel_attention_mask
  [B, I, H, W]``: each row's images, then all-zero images, which the model skips.

Next to them the token-aligned ``mm_token_type_ids [B, T]`` (Qwen-VL: 1 on image tokens, 0 elsewhere and
on padding) is padded and trimmed with ``input_ids``. A sequence without images has zero rows; a batch
without any image has none of these keys.
"""

from __future__ import annotations

import torch

from rl_core.batch import IMAGE_KEYS, Batch
from rl_core.vision_inputs import collate_image_inputs, image_layout

__all__ = ["IMAGE_KEYS", "forward_image_inputs", "has_image_rows", "image_rows"]


def image_rows(per_sequence: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The image tensors of ``per_sequence`` (each as :func:`rl_core.vision_inputs.encode_chat` gives it,
    ``{}`` for a sequence without images) as batch rows, dim 0 = sequences; ``{}`` when none has an image."""
    present = [inputs for inputs in per_sequence if inputs]
    if not present:
        return {}
    unknown = sorted({key for inputs in present for key in inputs} - set(IMAGE_KEYS))
    if unknown:
        raise ValueError(f"image inputs {unknown} are not supported in training batches (known: {list(IMAGE_KEYS)}); "
                         "this model family's processor is not supported yet")
    if image_layout(present[0]) == "batched":
        return collate_image_inputs(per_sequence)  # already [B, most images, ...], zero images as padding
    most_patches = max(inputs["pixel_values"].shape[0] for inputs in present)
    most_images = max(inputs["image_grid_thw"].shape[0] for inputs in present)
    example = present[0]
    pixels = example["pixel_values"].new_zeros(len(per_sequence), most_patches, example["pixel_values"].shape[1])
    grids = example["image_grid_thw"].new_zeros(len(per_sequence), most_images, 3)
    for row, inputs in enumerate(per_sequence):
        if inputs:
            if image_layout(inputs) != "flat" or sorted(inputs) != sorted(example):
                raise ValueError(f"image inputs of one batch differ in layout or keys: {sorted(inputs)} vs "
                                 f"{sorted(example)} (two model families?)")
            pixels[row, : inputs["pixel_values"].shape[0]] = inputs["pixel_values"]
            grids[row, : inputs["image_grid_thw"].shape[0]] = inputs["image_grid_thw"]
    return {"pixel_values": pixels, "image_grid_thw": grids}


def has_image_rows(batch: Batch) -> bool:
    """Whether ``batch`` carries image rows (some rows may still have no image)."""
    return "pixel_values" in batch


def forward_image_inputs(batch: Batch) -> dict[str, torch.Tensor]:
    """The image keyword arguments of one forward over ``batch``'s rows, in row order (``{}`` when none
    of them has an image): flat ``pixel_values [patches, D]`` + ``image_grid_thw [images, 3]``, or batched
    ``pixel_values [b, I, 3, H, W]`` + ``pixel_attention_mask`` trimmed to the most images of a row."""
    if not has_image_rows(batch):
        return {}
    pixels = batch["pixel_values"]
    if pixels.dim() == 5:  # batched: images that are not all zero are real; they come first in each row
        real = pixels.flatten(2).ne(0).any(-1)  # [b, I]
        most = int(real.sum(1).max()) if real.numel() else 0
        if most == 0:
            return {}
        return {key: batch[key][:, :most] for key in IMAGE_KEYS if key in batch and key != "image_grid_thw"}
    grids = batch["image_grid_thw"]  # [b, I, 3]
    patches = grids.prod(-1)  # [b, I]; 0 on padding rows
    if not bool(patches.gt(0).any()):
        return {}
    counts = patches.sum(-1).tolist()
    return {"pixel_values": torch.cat([pixels[row, :n] for row, n in enumerate(counts)]),
            "image_grid_thw": grids[patches.gt(0)]}
