"""The engine's own decode forward on CPU: Llama-style decoders (Llama, Mistral, Qwen2, Qwen3, and the
mixture-of-experts Qwen3-MoE and Mixtral: this module) and Qwen3.5's hybrid layers, dense and MoE
(``direct_qwen3_5.py``).

A decode step through transformers' modules spends a fixed cost per layer beyond its tensor work: the
model's output-capturing and config-defaults wrappers, a ``**kwargs`` hop and an attention-interface
lookup per layer, a module call per projection and norm. On CPU, where a step is a few milliseconds of
matrix products per layer at small batches, that cost is a measurable share of the step. This forward
calls the layers' operations directly, in transformers' order, on the same weights, with two merges:

* the query, key and value projections are one matrix product (Qwen3.5's gated delta-net: its four input
  projections), and a gated MLP's gate and up projections another: at load the engine packs each group's weights into one tensor and points the model's own
  ``nn.Linear`` weights at row slices of it (``pack_rows``), so the model's forward (prefill,
  training-shaped calls) and refit (``copy_weights_in_place`` copies in place) keep working unchanged
  and no weight is stored twice;
* rotary embedding of the queries and keys together (one set of elementwise ops over the packed heads)
  where the family has no per-head query / key norm.

A mixture-of-experts block is called as the module it is (its router, and on CPU the engine's expert
dispatch, ``moe.py``). A routing record (``routing.py``) keeps transformers' forward: its hooks sit on the
decoder's forward, which this one does not call. On CPU a product over packed rows computes each output
column as the separate product does: a decode step's hidden states equal transformers' forward's on the
same weights bitwise (tested in float32 and bfloat16). Packing moves the weights to new memory, and CPU
BLAS may round a product differently at another alignment: a whole generation against an engine with
unpacked weights gives the same tokens and float32 logprobs within 1e-6 (4.8e-7 seen), not always
bitwise. CUDA keeps transformers' forward (its decode steps are captured in
CUDA graphs, ``graphs.py``, and cuBLAS may pick another reduction for another width).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from rl_backends_gen.native import direct_qwen3_5
from rl_backends_gen.native.attention import decode_attention
from rl_backends_gen.native.cache import AttentionKV
from rl_backends_gen.native.direct_ops import DirectMLP, pack_rows, plain, rms_norm, rotate
from rl_backends_gen.native.steps import DecodeStep

# Decoder layers whose transformers forward (5.19) this module reproduces: pre-norm RMSNorm, q/k/v/o
# projections with rotary embedding (the Qwen3s: an RMSNorm over each query / key head before it), then a
# gated MLP or a mixture-of-experts block.
LAYERS = {"LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer", "Qwen3DecoderLayer",
          "Qwen3MoeDecoderLayer", "MixtralDecoderLayer"}


class DirectDecode:
    """``forward(tokens [R, q], rotary [R, q], step)`` -> final hidden states ``[R, q, hidden]``."""

    def __init__(self, decoder: nn.Module, cache, layers: list):
        self.decoder, self.cache, self.layers = decoder, cache, layers
        self.final_norm = direct_qwen3_5.norm_of(decoder.norm)

    @classmethod
    def of(cls, engine) -> DirectDecode | None:
        """The forward for ``engine``'s model, or None where the engine keeps transformers' forward: not on
        CPU, a vision-language model, FP8 weights, a routing record (its hooks sit on the decoder's forward),
        or any layer this module does not reproduce."""
        decoder = engine.decoder
        if engine.device.type != "cpu" or engine.vision is not None or engine.fp8_layers or engine.routing is not None:
            return None
        layers = decoder.layers[: decoder.config.num_hidden_layers]
        builders = [_builder(layer, cache) for layer, cache in zip(layers, engine.cache.layers, strict=True)]
        if not all(builders):
            return None
        # Only now, every layer reproducible: building a layer packs its weights.
        return cls(decoder, engine.cache, [build(layer) for build, layer in zip(builders, layers)])

    def forward(self, tokens: torch.Tensor, rotary: torch.Tensor, step: DecodeStep) -> torch.Tensor:
        hidden = F.embedding(tokens, self.decoder.embed_tokens.weight)
        cos, sin = self.decoder.rotary_emb(hidden, position_ids=rotary)  # [R, q, D], the model's dtype
        cos, sin = cos[:, :, None], sin[:, :, None]  # over heads: [R, q, 1, D]
        for layer, cache in zip(self.layers, self.cache.layers):
            hidden = layer.forward(hidden, cos, sin, step, cache)
        return self.final_norm(hidden, self.decoder.norm)


class DirectLayer:
    """One decoder layer: its modules, and its q/k/v (and a gated MLP's gate/up) weights packed."""

    def __init__(self, layer: nn.Module):
        self.layer, attention = layer, layer.self_attn
        projections = [attention.q_proj, attention.k_proj, attention.v_proj]
        self.qkv_weight, self.qkv_bias = pack_rows(projections)
        self.head_counts = [linear.out_features // attention.head_dim for linear in projections]
        self.head_norms = isinstance(getattr(attention, "q_norm", None), nn.Module)
        self.mlp = DirectMLP(layer.mlp)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, step: DecodeStep,
                cache: AttentionKV) -> torch.Tensor:
        layer, attention = self.layer, self.layer.self_attn
        rows, queries, _ = hidden.shape
        residual = hidden
        hidden = rms_norm(hidden, layer.input_layernorm)
        heads = F.linear(hidden, self.qkv_weight, self.qkv_bias).view(rows, queries, -1, attention.head_dim)
        query, key, value = heads.split(self.head_counts, dim=2)  # [R, q, heads, D] each
        if self.head_norms:
            query = rotate(rms_norm(query, attention.q_norm), cos, sin)
            key = rotate(rms_norm(key, attention.k_norm), cos, sin)
        else:
            query, key = rotate(heads[:, :, : self.head_counts[0] + self.head_counts[1]], cos, sin).split(
                self.head_counts[:2], dim=2)
        out = decode_attention(step, cache, query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                               attention.scaling, None)  # [R, q, H, D]
        hidden = residual + attention.o_proj(out.reshape(rows, queries, -1).contiguous())
        return hidden + self.mlp(rms_norm(hidden, layer.post_attention_layernorm))


def _builder(layer: nn.Module, cache):
    """What builds ``layer``'s direct form over its ``cache`` entry, or None where it has none."""
    if isinstance(cache, AttentionKV) and _reproducible(layer):
        return DirectLayer
    return direct_qwen3_5.builder(layer, cache)


def _reproducible(layer: nn.Module) -> bool:
    """A layer of a family in ``LAYERS`` built of plain modules (not FP8, not LoRA-wrapped)."""
    if type(layer).__name__ not in LAYERS:
        return False
    attention, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    linears = [getattr(attention, name, None) for name in ("q_proj", "k_proj", "v_proj", "o_proj")]
    linears += DirectMLP.linears(mlp)
    norms = [getattr(layer, "input_layernorm", None), getattr(layer, "post_attention_layernorm", None)]
    if isinstance(getattr(attention, "q_norm", None), nn.Module):
        norms += [attention.q_norm, attention.k_norm]
    return plain(linears) and \
        all(type(norm).__name__.endswith("RMSNorm") and hasattr(norm, "variance_epsilon") for norm in norms) and \
        isinstance(getattr(attention, "head_dim", None), int)
