"""A training batch is a plain ``dict[str, torch.Tensor]`` whose tensors share dim 0 (samples).

Standard keys (see rl_core.types for the conventions):
``input_ids`` [B, T] long, ``attention_mask`` [B, T] long (1 = real token), ``loss_mask`` [B, T]
float; algorithms add their own (``advantages`` [B, T], ``prev_logprobs`` [B, T],
``gen_logprobs`` [B, T], ``ref_logprobs`` [B, T], ``sample_mask`` [B], ...). A vision-language batch adds
its image tensors per row (``IMAGE_KEYS``, see rl_core.vision_batch) and ``mm_token_type_ids`` [B, T].
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

Batch = dict[str, torch.Tensor]
IMAGE_KEYS = ("pixel_values", "image_grid_thw", "pixel_attention_mask")
"""Per-row image tensors of a vision-language batch: dim 0 is the row, the other dims are not tokens."""


def batch_size(batch: Batch) -> int:
    sizes = {k: v.shape[0] for k, v in batch.items()}
    if len(set(sizes.values())) != 1:
        raise ValueError(f"batch tensors disagree on the number of samples: {sizes}")
    return next(iter(sizes.values()))


def select(batch: Batch, index: torch.Tensor | Sequence[int] | slice) -> Batch:
    """Rows ``index`` of every tensor."""
    if not isinstance(index, slice):
        index = torch.as_tensor(index, dtype=torch.long)
    return {k: v[index] for k, v in batch.items()}


def split(batch: Batch, micro_batch_size: int) -> list[Batch]:
    """Consecutive micro-batches of at most ``micro_batch_size`` samples."""
    if micro_batch_size <= 0:
        raise ValueError(f"micro_batch_size must be > 0, got {micro_batch_size}")
    n = batch_size(batch)
    return [select(batch, slice(i, i + micro_batch_size)) for i in range(0, n, micro_batch_size)]


def shard(batch: Batch, rank: int, world_size: int) -> Batch:
    """The ``rank``-th of ``world_size`` contiguous, equal shards (B must divide evenly)."""
    n = batch_size(batch)
    if n % world_size:
        raise ValueError(f"batch of {n} samples does not split evenly over {world_size} workers")
    per = n // world_size
    return select(batch, slice(rank * per, (rank + 1) * per))


def trim_padding(batch: Batch) -> Batch:
    """Drop trailing columns that are padding in every row (uses ``attention_mask``; image tensors are kept)."""
    mask = batch["attention_mask"]
    length = int(mask.sum(dim=1).max().item()) if mask.numel() else 0
    return {k: (v[:, :length] if v.dim() >= 2 and v.shape[1] == mask.shape[1] and k not in IMAGE_KEYS else v)
            for k, v in batch.items()}
