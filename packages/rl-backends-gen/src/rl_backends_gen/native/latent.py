"""Multi-head latent attention (MLA: DeepSeek-V2, GLM-4.7-Flash) over the engine's ``LatentKV`` cache.

The layer compresses each token's keys and values into one normalised latent ``c`` (kv_lora_rank)
plus one rotary key ``k_rot`` shared by all heads; per head, ``k = [W_uk c, k_rot]`` and
``v = W_uv c`` (``kv_b_proj`` holds ``W_uk`` and ``W_uv``). The cache keeps only ``c`` and ``k_rot``.

* Prefill expands the latents to per-head keys/values and runs causal SDPA (as transformers does).
* Decode never expands the cache: it folds ``W_uk`` into the query (``q_nope W_uk`` scores against
  ``c`` directly) and ``W_uv`` into the output (``(weights @ c) W_uv^T``), the same function in
  O(L x kv_lora_rank) per head instead of O(L x kv_lora_rank x head_dim) to expand every cached token.

``install(module)`` replaces the attention module's ``forward`` on the engine's own model instance
(its parameters, names and weight updates are untouched).
"""

from __future__ import annotations

import sys
import types

import torch
import torch.nn.functional as F

from rl_backends_gen.native.attention import key_scores
from rl_backends_gen.native.cache import LatentKV
from rl_backends_gen.native.steps import DecodeStep, PrefillStep


def install(module) -> None:
    module.forward = types.MethodType(latent_attention_forward, module)


def latent_attention_forward(self, hidden_states, position_embeddings, attention_mask=None, past_key_values=None,
                             rl_step=None, **kwargs):
    """``hidden_states`` [B, q, hidden] -> ``([B, q, hidden], None)``, reading/writing the step's cache."""
    batch, length = hidden_states.shape[:-1]
    if self.q_lora_rank is None:
        q_states = self.q_proj(hidden_states)
    else:
        q_states = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)))
    q_states = q_states.view(batch, length, -1, self.qk_head_dim).transpose(1, 2)  # [B, H, q, nope + rope]
    q_pass, q_rot = torch.split(q_states, [self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
    latent, k_rot = torch.split(self.kv_a_proj_with_mqa(hidden_states), [self.kv_lora_rank, self.qk_rope_head_dim],
                                dim=-1)
    latent = self.kv_a_layernorm(latent).view(batch, 1, length, self.kv_lora_rank)
    k_rot = k_rot.view(batch, 1, length, self.qk_rope_head_dim)
    rotary = sys.modules[type(self).__module__]
    cos, sin = position_embeddings
    rotate = rotary.apply_rotary_pos_emb_interleave if self.config.rope_interleave else rotary.apply_rotary_pos_emb
    q_rot, k_rot = rotate(q_rot, k_rot, cos, sin)
    layer = rl_step.cache.layers[self.layer_idx]
    if isinstance(rl_step, DecodeStep):
        out = _decode(self, rl_step, layer, q_pass, q_rot, latent, k_rot)  # [R, q, H, v_head_dim]
    else:
        out = _prefill(self, rl_step, layer, torch.cat([q_pass, q_rot], dim=-1), latent, k_rot)
    return self.o_proj(out.reshape(batch, length, -1)), None


def _prefill(self, step: PrefillStep, layer: LatentKV, query, latent, k_rot) -> torch.Tensor:
    """Cache the prompts' latents; expand them (after the cached prefix, if any) and attend causally."""
    start, end = step.start, step.start + latent.shape[2]
    layer["latent"][step.slots, :, start:end] = latent[step.row_of_slot]
    layer["rope_key"][step.slots, :, start:end] = k_rot[step.row_of_slot]
    if start:
        latent = torch.cat([layer["latent"][step.first_slot_of_row, :, :start], latent], dim=2)
        k_rot = torch.cat([layer["rope_key"][step.first_slot_of_row, :, :start], k_rot], dim=2)
    key, value = self.expand_kv(latent, k_rot)  # [P, H, start + q, nope + rope], [P, H, start + q, v]
    mask = step.mask(None)[None, None] if start else None
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, is_causal=not start, scale=self.scaling)
    return out.transpose(1, 2)  # [P, q, H, v]


def _decode(self, step: DecodeStep, layer: LatentKV, q_pass, q_rot, latent, k_rot) -> torch.Tensor:
    """Attention of q queries per row (1, or a speculative verification's) in the latent space (see
    the module docstring). Returns [R, q, H, v]."""
    rows, heads, queries = q_pass.shape[:3]
    if queries == 1:
        layer["latent"][step.rows, :, step.positions] = latent[:, :, 0]
        layer["rope_key"][step.rows, :, step.positions] = k_rot[:, :, 0]
    else:
        layer["latent"][step.rows[:, None], :, step.positions] = latent.transpose(1, 2)  # [R, q, 1, lora]
        layer["rope_key"][step.rows[:, None], :, step.positions] = k_rot.transpose(1, 2)
    cached = layer["latent"][:rows, 0, : step.length]  # [R, L, kv_lora_rank]
    cached_rot = layer["rope_key"][:rows, 0, : step.length]  # [R, L, rope]
    up = self.kv_b_proj.weight.view(heads, self.qk_nope_head_dim + self.v_head_dim, self.kv_lora_rank)
    up_key, up_value = up[:, : self.qk_nope_head_dim], up[:, self.qk_nope_head_dim :]  # [H, nope | v, lora]
    q_latent = torch.einsum("rhqd,hdc->rhqc", q_pass, up_key).reshape(rows, heads * queries, -1)  # [R, H x q, lora]
    q_rot = q_rot.reshape(rows, heads * queries, -1)
    scores = key_scores(q_latent, cached) + key_scores(q_rot, cached_rot)  # [R, H x q, L]
    _, mask = step.mask(None)  # [R, 1, q, L]
    mask = mask[:, 0].repeat(1, heads, 1) if queries > 1 else mask[:, 0]  # row h x q + i: query i of head h
    scores = scores * self.scaling
    scores = scores + mask if step.float_bias else scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores.float(), dim=-1).to(cached.dtype)  # [R, H x q, L]
    out_latent = torch.bmm(weights, cached).view(rows, heads, queries, -1)  # [R, H, q, lora]
    return torch.einsum("rhqc,hvc->rqhv", out_latent, up_value)  # [R, q, H, v]
