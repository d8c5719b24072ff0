"""The engine's own decode layers on CPU for Qwen3.5, dense and MoE (``qwen3_5_text``, ``qwen3_5_moe_text``):
its gated delta-net (linear attention) layers and its gated full-attention layers, driven by ``direct.py``.

transformers' forward of these layers (5.19), which the engine's decode otherwise runs, differs from a
Llama layer in what ``direct.py``'s layer does not reproduce: a zero-centred RMSNorm (weight offset from 1,
applied in float32), a full-attention query projection twice as wide (the queries and a sigmoid gate on
the attention's output), per-head query / key norms and a partial rotary embedding (the first quarter of
each head). The linear-attention layers project their input four ways (the convolution's q/k/v channels, the
output gate ``z``, the write strength ``beta``, the decay ``a``). Here each layer runs those operations
directly, with transformers' order and the engine's own recurrent kernels (``recurrent.py``,
``recurrent_steps.py``), and one matrix product per group of projections: the four input projections of
a delta-net layer, the gated query, key and value projections of an attention layer, and the MLP's gate and
up projections (``direct_ops.pack_rows``: the model's linears become row slices of the pack, so prefill and
refit are unchanged). A decode step's hidden states equal transformers' forward's bitwise (CPU, float32
and bfloat16; ``tests/rl_backends_gen/test_native_direct.py``).

A decode step is one token per row here: speculative verification, the only multi-token decode step, is
refused for recurrent layers (``speculative.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from rl_backends_gen.native import recurrent, recurrent_steps
from rl_backends_gen.native.attention import decode_attention
from rl_backends_gen.native.cache import AttentionKV, RecurrentState
from rl_backends_gen.native.direct_ops import DirectMLP, pack_rows, plain, rms_norm, rotate, zero_centered_rms_norm
from rl_backends_gen.native.steps import DecodeStep

LAYERS = {"Qwen3_5DecoderLayer", "Qwen3_5MoeDecoderLayer"}
NORMS = {"Qwen3_5RMSNorm", "Qwen3_5MoeRMSNorm"}


def norm_of(norm: nn.Module):
    """The norm function of a decoder's RMSNorm ``norm``: Qwen3.5's zero-centred one, else Llama's."""
    return zero_centered_rms_norm if type(norm).__name__ in NORMS else rms_norm


def builder(layer: nn.Module, cache):
    """The direct layer class for a Qwen3.5 decoder ``layer`` over its ``cache`` entry, or None."""
    if type(layer).__name__ not in LAYERS or not _norms_reproducible(layer):
        return None
    if not plain(DirectMLP.linears(layer.mlp)):
        return None
    if layer.block_type == "linear_attention" and isinstance(cache, RecurrentState):
        mixer = layer.linear_attn
        linears = [mixer.in_proj_qkv, mixer.in_proj_z, mixer.in_proj_b, mixer.in_proj_a, mixer.out_proj]
        if plain(linears):
            return GatedDeltaNetLayer
    if layer.block_type == "full_attention" and isinstance(cache, AttentionKV) and cache.window is None:
        attention = layer.self_attn
        linears = [getattr(attention, name, None) for name in ("q_proj", "k_proj", "v_proj", "o_proj")]
        if plain(linears) and all(type(getattr(attention, name, None)).__name__ in NORMS
                                  for name in ("q_norm", "k_norm")):
            return GatedAttentionLayer
    return None


def _norms_reproducible(layer: nn.Module) -> bool:
    return all(type(getattr(layer, name, None)).__name__ in NORMS
               for name in ("input_layernorm", "post_attention_layernorm"))


class GatedDeltaNetLayer:
    """A linear-attention layer: norm, the four input projections as one product, then the engine's mixer
    steps (``recurrent.py``: convolution, delta-rule inputs, the gated delta rule on the row's cached state,
    gated RMSNorm and output projection); the MLP."""

    def __init__(self, layer: nn.Module):
        self.layer, mixer = layer, layer.linear_attn
        self.weight, self.bias = pack_rows([mixer.in_proj_qkv, mixer.in_proj_z, mixer.in_proj_b, mixer.in_proj_a])
        self.widths = [mixer.conv_dim, mixer.value_dim, mixer.num_v_heads, mixer.num_v_heads]
        self.mlp = DirectMLP(layer.mlp)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, step: DecodeStep,
                cache: RecurrentState) -> torch.Tensor:
        layer, mixer = self.layer, self.layer.linear_attn
        rows = hidden.shape[0]
        residual = hidden
        hidden = zero_centered_rms_norm(hidden, layer.input_layernorm)
        mixed, z, b, a = F.linear(hidden, self.weight, self.bias).split(self.widths, dim=-1)
        mixed = recurrent.convolve(mixer, mixed.transpose(1, 2), step, cache).transpose(1, 2)  # [R, 1, conv_dim]
        query, key, value, g, beta = recurrent.delta_rule_inputs(mixer, mixed, b, a)
        out = recurrent_steps.gated_delta_step(query, key, value, g, beta, cache["state"][:rows])  # state in place
        hidden = residual + recurrent.delta_rule_output(mixer, out, z)
        return hidden + self.mlp(zero_centered_rms_norm(hidden, layer.post_attention_layernorm))


class GatedAttentionLayer:
    """A full-attention layer: norm, the gated query, key and value projections as one product, per-head
    norms, partial rotary embedding, attention over the row's cache, the sigmoid output gate; the MLP."""

    def __init__(self, layer: nn.Module):
        self.layer, attention = layer, layer.self_attn
        projections = [attention.q_proj, attention.k_proj, attention.v_proj]
        self.weight, self.bias = pack_rows(projections)
        self.widths = [linear.out_features for linear in projections]
        self.mlp = DirectMLP(layer.mlp)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, step: DecodeStep,
                cache: AttentionKV) -> torch.Tensor:
        layer, attention = self.layer, self.layer.self_attn
        rows, queries, _ = hidden.shape
        head_dim = attention.head_dim
        residual = hidden
        hidden = zero_centered_rms_norm(hidden, layer.input_layernorm)
        gated, key, value = F.linear(hidden, self.weight, self.bias).split(self.widths, dim=-1)
        query, gate = torch.chunk(gated.view(rows, queries, -1, head_dim * 2), 2, dim=-1)  # [R, q, H, D] each
        gate = gate.reshape(rows, queries, -1)
        query = rotate(zero_centered_rms_norm(query, attention.q_norm), cos, sin)
        key = rotate(zero_centered_rms_norm(key.view(rows, queries, -1, head_dim), attention.k_norm), cos, sin)
        value = value.view(rows, queries, -1, head_dim)
        out = decode_attention(step, cache, query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                               attention.scaling, None)  # [R, q, H, D]
        out = out.reshape(rows, queries, -1).contiguous() * torch.sigmoid(gate)
        hidden = residual + attention.o_proj(out)
        return hidden + self.mlp(zero_centered_rms_norm(hidden, layer.post_attention_layernorm))

