"""The KV cache of generation on the Megatron workers, and the core attention that reads and writes it.

While ``cached_attention(model, steps)`` is entered, every decoder layer's core attention (megatron-core's
``DotProductAttention``, or this backend's context-parallel one) is replaced by ``CachedAttention``,
which hands its inputs to the current step (``steps.current``): the rest of the layer (fused qkv, q/k
norms, RoPE at the given positions, output projection, MLP or experts, tensor-parallel collectives)
is the training model's own. On leaving, the layers get their core attention back; the module holds
no parameters, so nothing else changes.

Megatron's core attention sees this rank's heads: ``query [s, b, heads, head_dim]`` and ``key`` /
``value`` ``[s, b, groups, head_dim]`` (heads and query groups divided by tensor parallel). The cache
holds, per decoder layer of this rank (every model chunk), keys and values
``[rows, groups, length, head_dim]``; row r is a sample being decoded.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


class GenerationCache:
    """Keys and values of one batch of samples, per decoder layer of this rank; allocated for one batch
    of a ``generate`` call and dropped after it."""

    def __init__(self, num_layers: int, rows: int, groups: int, length: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        # zeros, not empty: masked positions get weight 0, but 0 * NaN from unwritten memory is NaN.
        shape = (rows, groups, length, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    def keep_rows(self, keep: torch.Tensor) -> None:
        """Only rows ``keep`` [R'] (in that order) stay: finished samples leave the batch."""
        self.keys = [k.index_select(0, keep) for k in self.keys]
        self.values = [v.index_select(0, keep) for v in self.values]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)


class PrefillStep:
    """Causal attention over right-padded prompts ``[P, W]``; their keys and values go into cache rows
    ``slots`` [A], row ``slots[a]`` copying prompt ``row_of_slot[a]`` (n samples share one prefill).
    Right padding: a real token never sees a pad (pads come after it), so plain causal is exact."""

    def __init__(self, cache: GenerationCache, slots: torch.Tensor, row_of_slot: torch.Tensor) -> None:
        self.cache, self.slots, self.row_of_slot = cache, slots, row_of_slot

    def attend(self, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               scale: float) -> torch.Tensor:
        """``query [P, heads, W, d]``, ``key`` / ``value [P, groups, W, d]`` -> ``[P, heads, W, d]``."""
        width = key.shape[2]
        self.cache.keys[layer][self.slots, :, :width] = key[self.row_of_slot]
        self.cache.values[layer][self.slots, :, :width] = value[self.row_of_slot]
        return F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scale,
                                              enable_gqa=query.shape[1] != key.shape[1])


class DecodeStep:
    """One new token for each cache row, at per-row ``positions`` [R]: its key and value are written
    there, and it attends to the row's positions ``0 .. position``."""

    def __init__(self, cache: GenerationCache, positions: torch.Tensor) -> None:
        self.cache, self.positions = cache, positions
        self.rows = torch.arange(positions.shape[0], device=positions.device)
        self.length = int(positions.max()) + 1
        keep = torch.arange(self.length, device=positions.device)[None, :] <= positions[:, None]  # [R, L]
        self.mask = keep[:, None, None, :]  # [R, 1, 1, L]

    def attend(self, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               scale: float) -> torch.Tensor:
        """``query [R, heads, 1, d]``, ``key`` / ``value [R, groups, 1, d]`` -> ``[R, heads, 1, d]``."""
        keys, values = self.cache.keys[layer], self.cache.values[layer]
        keys[self.rows, :, self.positions] = key[:, :, 0]
        values[self.rows, :, self.positions] = value[:, :, 0]
        return F.scaled_dot_product_attention(query, keys[:, :, : self.length], values[:, :, : self.length],
                                              attn_mask=self.mask, scale=scale,
                                              enable_gqa=query.shape[1] != key.shape[1])


@dataclass
class Steps:
    """What the cached attention of every layer does in the current forward."""

    current: PrefillStep | DecodeStep | None = None


class CachedAttention(nn.Module):
    """A decoder layer's core attention during generation: Megatron's ``[s, b, heads, d]`` layout in and
    ``[s, b, heads * d]`` out, the attention itself by ``steps.current``."""

    def __init__(self, layer: int, scale: float, steps: Steps) -> None:
        super().__init__()
        self.layer, self.scale, self.steps = layer, scale, steps

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask=None,
                attn_mask_type=None, attention_bias=None, packed_seq_params=None) -> torch.Tensor:
        s, b, heads, d = query.shape
        out = self.steps.current.attend(self.layer, query.permute(1, 2, 0, 3), key.permute(1, 2, 0, 3),
                                        value.permute(1, 2, 0, 3), self.scale)  # [b, heads, s, d]
        return out.permute(2, 0, 1, 3).reshape(s, b, heads * d)


def attention_modules(model) -> list[nn.Module]:
    """The self-attention module of every decoder layer of this rank (all model chunks), in cache order."""
    return [layer.self_attention for chunk in model.model_chunks for layer in chunk.gpt.decoder.layers]


@contextlib.contextmanager
def cached_attention(model, steps: Steps):
    """Every decoder layer of ``model`` attends through ``steps`` inside; its own core attention after."""
    modules = attention_modules(model)
    originals = [m.core_attention for m in modules]
    try:
        for layer, (module, original) in enumerate(zip(modules, originals)):
            module.core_attention = CachedAttention(layer, float(original.softmax_scale), steps)
        yield
    finally:
        for module, original in zip(modules, originals):
            module.core_attention = original
