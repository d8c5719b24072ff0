"""A KV cache allocated once, and the attention function that reads and writes it.

Layout: per layer, keys and values of shape ``[max_rows, kv_heads, max_seq_len, head_dim]``. The
active rows of the batch always occupy slots ``0 .. R-1`` (finished rows are replaced by the last
active row), so a decode step attends over the plain view ``[:R, :, :L]``: no gather, no copy.

The attention function is registered with transformers as ``"rl_native"``; the engine passes a step
object (``rl_step=...``) through the model's ``forward`` kwargs down to every attention layer.
Because no mask function is registered for ``"rl_native"``, transformers builds no mask at all:
the step object owns masking.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

ATTENTION_NAME = "rl_native"


class KVCache:
    """Preallocated per-layer key/value buffers."""

    def __init__(self, num_layers: int, max_rows: int, max_seq_len: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):
        self.shape = (max_rows, num_kv_heads, max_seq_len, head_dim)
        self.num_layers, self.dtype, self.device = num_layers, dtype, device
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.clean_length = 0
        self.allocate()

    @property
    def max_rows(self) -> int:
        return self.shape[0]

    @property
    def max_seq_len(self) -> int:
        return self.shape[2]

    @property
    def allocated(self) -> bool:
        return bool(self.keys)

    def allocate(self) -> None:
        # torch.empty: on CPU the pages are only committed when they are first written.
        self.keys = [torch.empty(self.shape, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)]
        self.values = [torch.empty(self.shape, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)]
        self.clean_length = 0

    def free(self) -> None:
        self.keys, self.values = [], []
        self.clean_length = 0

    def ensure_clean(self, length: int) -> None:
        """Make positions ``:length`` of every row finite.

        A decode step attends over ``[:R, :, :L]`` and masks what a row has not written; masking
        zeroes the weight of a key, but ``0 * NaN`` is still NaN, so never-written memory must not
        hold NaN/inf. Positions are zeroed once, the first time any step reaches them; after that
        they only ever hold real (finite) keys and values of earlier rows. Every step calls this
        before it writes, so written positions are always below ``clean_length`` and zeroing never
        touches live data.
        """
        if length <= self.clean_length:
            return
        for buffer in self.keys + self.values:
            buffer[:, :, self.clean_length : length].zero_()
        self.clean_length = length

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    def move_rows(self, src: torch.Tensor, dst: torch.Tensor, length: int) -> None:
        """Copy rows ``src`` to rows ``dst`` (positions ``:length``) in every layer."""
        for buffer in self.keys + self.values:
            buffer[dst, :, :length] = buffer[src, :, :length]


class PrefillStep:
    """Causal attention over right-padded prompts; writes their keys/values into cache rows.

    ``row_of_slot`` [A]: for every destination slot, which prefill row it copies (samples of one
    prompt share that prompt's prefill). ``slots`` [A]: the destination slots.
    """

    def __init__(self, cache: KVCache, slots: torch.Tensor, row_of_slot: torch.Tensor, width: int):
        self.cache, self.slots, self.row_of_slot = cache, slots, row_of_slot
        cache.ensure_clean(width)  # before any write: every written position stays below clean_length

    def attend(self, layer: int, query, key, value, scaling: float) -> torch.Tensor:
        length = key.shape[2]
        self.cache.keys[layer][self.slots, :, :length] = key[self.row_of_slot]
        self.cache.values[layer][self.slots, :, :length] = value[self.row_of_slot]
        # Right padding: a real token never sees a pad (pads come after it), so plain causal is exact.
        out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling,
                                             enable_gqa=query.shape[1] != key.shape[1])
        return out.transpose(1, 2).contiguous()  # [P, L, H, D]


class SuffixPrefillStep:
    """Prefill of the rest of each prompt after a prefix already in the cache (``start`` tokens,
    written to every slot by a ``PrefillStep`` of the shared prefix): queries attend to the cached
    prefix and causally to their own new tokens.

    ``first_slot_of_row`` [P]: a slot holding each prefill row's prefix (all slots hold the same one).
    """

    def __init__(self, cache: KVCache, slots: torch.Tensor, row_of_slot: torch.Tensor,
                 first_slot_of_row: torch.Tensor, start: int, width: int):
        self.cache, self.slots, self.row_of_slot = cache, slots, row_of_slot
        self.first_slot_of_row, self.start = first_slot_of_row, start
        cache.ensure_clean(start + width)
        causal = torch.ones(width, width, dtype=torch.bool, device=slots.device).tril()
        prefix = torch.ones(width, start, dtype=torch.bool, device=slots.device)
        self.mask = torch.cat([prefix, causal], dim=1)[None, None]  # [1, 1, width, start + width]

    def attend(self, layer: int, query, key, value, scaling: float) -> torch.Tensor:
        start, end = self.start, self.start + key.shape[2]
        keys, values = self.cache.keys[layer], self.cache.values[layer]
        keys[self.slots, :, start:end] = key[self.row_of_slot]
        values[self.slots, :, start:end] = value[self.row_of_slot]
        all_keys = torch.cat([keys[self.first_slot_of_row, :, :start], key], dim=2)
        all_values = torch.cat([values[self.first_slot_of_row, :, :start], value], dim=2)
        out = F.scaled_dot_product_attention(query, all_keys, all_values, attn_mask=self.mask, scale=scaling,
                                             enable_gqa=query.shape[1] != key.shape[1])
        return out.transpose(1, 2).contiguous()  # [P, width, H, D]


class DecodeStep:
    """One new token for each of the active rows ``0 .. R-1``, at per-row ``positions`` [R].

    float32: attention is two batched matmuls with the query heads grouped under their key/value
    head (``[R, kv_heads, group, D] @ [R, kv_heads, D, L]``), ~1.7x faster than CPU SDPA with a mask
    for one query token (measured at R=64). Other dtypes: SDPA, which reads the half-precision cache
    in place where the batched matmul would first copy it (2x faster for bf16 at R=64).
    """

    def __init__(self, cache: KVCache, positions: torch.Tensor):
        self.cache = cache
        self.positions = positions
        self.rows = torch.arange(positions.shape[0], device=positions.device)
        self.length = int(positions.max()) + 1
        cache.ensure_clean(self.length)
        keep = torch.arange(self.length, device=positions.device)[None, :] <= positions[:, None]  # [R, L]
        self.grouped = cache.dtype == torch.float32
        if self.grouped:  # [R, 1, 1, L]: 0 where the row has written that key position, -inf elsewhere
            self.bias = torch.zeros(keep.shape, dtype=torch.float32, device=positions.device)
            self.bias = self.bias.masked_fill(~keep, float("-inf"))[:, None, None, :]
        else:
            self.mask = keep[:, None, None, :]

    def attend(self, layer: int, query, key, value, scaling: float) -> torch.Tensor:
        num_rows, heads, _, dim = query.shape
        kv_heads = key.shape[1]
        keys, values = self.cache.keys[layer], self.cache.values[layer]
        keys[self.rows, :, self.positions] = key[:, :, 0]  # [R, kv_heads, D]
        values[self.rows, :, self.positions] = value[:, :, 0]
        keys, values = keys[:num_rows, :, : self.length], values[:num_rows, :, : self.length]
        if not self.grouped:
            out = F.scaled_dot_product_attention(query, keys, values, attn_mask=self.mask, scale=scaling,
                                                 enable_gqa=heads != kv_heads)
            return out.transpose(1, 2)  # [R, 1, H, D]
        grouped = query.reshape(num_rows, kv_heads, heads // kv_heads, dim)  # head h reads kv head h // group
        scores = torch.matmul(grouped, keys.transpose(-1, -2)) * scaling
        weights = torch.softmax(scores + self.bias, dim=-1)  # [R, kv_heads, group, L]
        out = torch.matmul(weights, values)  # [R, kv_heads, group, D]
        return out.reshape(num_rows, 1, heads, dim)  # [R, 1, H, D]


def native_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, rl_step=None, **kwargs):
    """transformers attention interface: ``query`` [B, H, q, D], ``key``/``value`` [B, kv_heads, q, D]."""
    if rl_step is None:
        raise RuntimeError(
            "this model instance belongs to a NativeEngine (its attention reads the engine's KV cache); "
            "load a separate model for plain forward passes"
        )
    return rl_step.attend(module.layer_idx, query, key, value, scaling), None


def register_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, native_attention)
