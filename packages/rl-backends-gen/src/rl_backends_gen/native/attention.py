"""Softmax attention over the engine's ``AttentionKV`` cache: full or sliding-window, with or without
attention sinks (GPT-OSS's per-head extra logit that takes probability mass and returns no value).

Registered with transformers as the attention implementation ``"rl_native"``: the model's own
attention modules project, normalise and rotate queries and keys, then call ``native_attention``
with the step object the engine passed down (``rl_step=...``). No mask function is registered for
``"rl_native"``, so transformers builds no mask: the step owns masking.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rl_backends_gen.native.cache import AttentionKV
from rl_backends_gen.native.steps import DecodeStep, PrefillStep, SequenceStep

ATTENTION_NAME = "rl_native"


def native_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, rl_step=None, s_aux=None,
                     **kwargs):
    """transformers attention interface: ``query`` [B, H, q, D], ``key``/``value`` [B, kv_heads, q, D];
    ``s_aux`` [H]: attention sinks (GPT-OSS). Returns ``([B, q, H, D], None)``."""
    if rl_step is None:
        raise RuntimeError(
            "this model instance belongs to a NativeEngine (its attention reads the engine's KV cache); "
            "load a separate model for plain forward passes"
        )
    layer = rl_step.cache.layers[module.layer_idx]
    if isinstance(rl_step, SequenceStep):  # draft training: whole sequences, no cache
        allowed = rl_step.mask(layer.window)[None, None]
        return masked_attention(query, key, value, allowed, scaling, s_aux).transpose(1, 2).contiguous(), None
    if isinstance(rl_step, DecodeStep):
        return decode_attention(rl_step, layer, query, key, value, scaling, s_aux), None
    return prefill_attention(rl_step, layer, query, key, value, scaling, s_aux), None


def register_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, native_attention)


def prefill_attention(step: PrefillStep, layer: AttentionKV, query, key, value, scaling: float,
                      sinks: torch.Tensor | None) -> torch.Tensor:
    """Write the prompts' keys/values to their rows, attend causally (after the cached prefix, if
    any). Right padding: a real token never sees a pad (pads come after it). Returns [P, q, H, D]."""
    start, end = step.start, step.start + key.shape[2]
    keys, values = layer["keys"], layer["values"]
    keys[step.slots, :, start:end] = key[step.row_of_slot]
    values[step.slots, :, start:end] = value[step.row_of_slot]
    if start:
        key = torch.cat([keys[step.first_slot_of_row, :, :start], key], dim=2)
        value = torch.cat([values[step.first_slot_of_row, :, :start], value], dim=2)
    if start == 0 and layer.window is None and sinks is None:
        out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling,
                                             enable_gqa=query.shape[1] != key.shape[1])
    else:
        out = masked_attention(query, key, value, step.mask(layer.window)[None, None], scaling, sinks)
    return out.transpose(1, 2).contiguous()


def masked_attention(query, key, value, allowed: torch.Tensor, scaling: float, sinks: torch.Tensor | None):
    """``[B, H, q, D]`` attention with a bool mask (True = may attend), optionally with sinks."""
    if sinks is None:
        return F.scaled_dot_product_attention(query, key, value, attn_mask=allowed, scale=scaling,
                                              enable_gqa=query.shape[1] != key.shape[1])
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling
    scores = scores.masked_fill(~allowed, float("-inf"))
    weights = softmax_with_sinks(scores, sinks.reshape(1, -1, 1, 1))
    return torch.matmul(weights, value)


def key_scores(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """``queries @ keys^T`` over a slice of a key cache: ``[..., q, D]`` x ``[..., L, D]`` -> ``[..., q, L]``.

    In bfloat16 on CPU it runs as ``(keys @ queries^T)^T``. CPU's bfloat16 batched matmul makes
    its operands contiguous first, and the cache's slice is not (its batch stride is the cache's): the keys
    transposed, that is a transposing copy of every cached key, every layer and step; untransposed, a plain
    copy of rows, ~4x cheaper. The same dot products (bitwise equal in the tests); the product 1.6-2.7x and
    a layer's whole decode attention 1.2-1.7x faster at 60-1000 cached positions (64 rows, 3 kv heads of 3
    queries, 2-core CPU, torch 2.13; docs/benchmarks.md). float32 and float16 keep ``queries @ keys^T``, the
    faster there (float16 copies neither way)."""
    if keys.device.type == "cpu" and keys.dtype == torch.bfloat16:
        return torch.matmul(keys, queries.transpose(-1, -2)).transpose(-1, -2)
    return torch.matmul(queries, keys.transpose(-1, -2))


def softmax_with_sinks(scores: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """softmax over ``[scores, sink]`` along the last axis, the sink's column dropped: the sink takes
    probability mass and contributes no value (``sinks`` broadcasts to ``scores[..., :1]``)."""
    combined = torch.cat([scores, sinks.to(scores.dtype).expand(*scores.shape[:-1], 1)], dim=-1)
    combined = combined - combined.amax(dim=-1, keepdim=True)
    return torch.softmax(combined, dim=-1)[..., :-1]


def decode_attention(step: DecodeStep, layer: AttentionKV, query, key, value, scaling: float,
                     sinks: torch.Tensor | None) -> torch.Tensor:
    """q queries per active row (1, or a speculative verification's last token and proposals) over the
    positions each has written (its window's, for a sliding layer). Returns [R, q, H, D].

    On CPU, and in float32 anywhere (and always with sinks): two batched matmuls with the query heads
    grouped under their key/value head (``[R, kv_heads, group x q, D] @ [R, kv_heads, D, L]``), the
    scores and softmax in float32. One query token at R=64 (9 heads over 3, 2-core CPU, torch 2.13):
    ~1.3x faster than SDPA with a mask in float32, and 4-6x in bfloat16, where CPU SDPA took 3.3 ms
    a layer at 60 cached positions against 0.55 ms (13.3 against 3.3 ms at 300). Half precision on
    CUDA: SDPA."""
    num_rows, heads, queries, dim = query.shape
    kv_heads = key.shape[1]
    keys, values = layer["keys"], layer["values"]
    if queries == 1:
        keys[step.rows, :, step.positions] = key[:, :, 0]  # [R, kv_heads, D]
        values[step.rows, :, step.positions] = value[:, :, 0]
    else:
        keys[step.rows[:, None], :, step.positions] = key.transpose(1, 2)  # [R, q, kv_heads, D]
        values[step.rows[:, None], :, step.positions] = value.transpose(1, 2)
    first, mask = step.mask(layer.window)  # [R, 1, q, L']
    keys, values = keys[:num_rows, :, first:step.length], values[:num_rows, :, first:step.length]
    if sinks is None and not step.float_bias:
        out = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, scale=scaling,
                                             enable_gqa=heads != kv_heads)
        return out.transpose(1, 2)  # [R, q, H, D]
    group = heads // kv_heads
    # Head h reads kv head h // group; row g * q + i of a kv head's block is query i of its head g.
    grouped = query.reshape(num_rows, kv_heads, group * queries, dim)
    if queries > 1:
        mask = mask.repeat(1, 1, group, 1)
    scores = key_scores(grouped, keys).to(torch.float32, memory_format=torch.contiguous_format) * scaling
    # scores: [R, kv_heads, group x q, L]
    scores = scores + mask if step.float_bias else scores.masked_fill(~mask, float("-inf"))
    if sinks is None:
        weights = torch.softmax(scores, dim=-1)
    else:
        weights = softmax_with_sinks(scores, sinks.reshape(1, kv_heads, group, 1).repeat_interleave(queries, dim=2))
    out = torch.matmul(weights.to(values.dtype), values)  # [R, kv_heads, group x q, D]
    if queries == 1:
        return out.reshape(num_rows, 1, heads, dim)
    return out.view(num_rows, kv_heads, group, queries, dim).permute(0, 3, 1, 2, 4).reshape(num_rows, queries, heads, dim)
