"""Which cache each decoder layer of an HF model needs, and the mixers the engine drives itself.

Softmax attention (full or sliding-window, with or without sinks) runs the model's own attention
modules through the ``"rl_native"`` attention function. Multi-head latent attention and the
recurrent mixers get an engine ``forward`` on the engine's own model instance (``latent.py``,
``recurrent.py``); on CPU, experts modules get the engine's dispatch (``moe.py``). Anything else is
refused when the engine is built, naming the family, the layer and what to use instead, rather than
computed wrongly.
"""

from __future__ import annotations

import torch
from torch import nn

from rl_backends_gen.native import latent, moe, recurrent
from rl_backends_gen.native.cache import AttentionKV, LatentKV, LayerCache, RecurrentState

# Mixer classes whose transformers forward the engine re-implements (verified against transformers 5.19).
GATED_DELTA_NETS = {"Qwen3_5GatedDeltaNet", "Qwen3_5MoeGatedDeltaNet"}
MAMBA2_MIXERS = {"NemotronHMamba2Mixer"}
LATENT_ATTENTIONS = {"Glm4MoeLiteAttention"}
SOFTMAX_LAYER_TYPES = {"full_attention", "sliding_attention"}
ELSEWHERE = "use generation.backend=vllm (or hf) for it"


def build_layer_caches(model: nn.Module, rows: int, max_seq_len: int, dtype: torch.dtype,
                       device: torch.device) -> list[LayerCache | None]:
    """One cache per decoder layer of ``model`` (None for a block without a token mixer), installing
    the engine's forward on the mixers that need one. Raises NotImplementedError for what the
    engine does not implement."""
    config = model.config.get_text_config()  # of a vision-language model: its language model
    family = config.model_type
    for feature in ("attn_logit_softcapping", "final_logit_softcapping"):
        if getattr(config, feature, None):
            raise NotImplementedError(f"NativeEngine does not implement {feature} ({family}); {ELSEWHERE}")
    if device.type == "cpu":  # the engine's expert dispatch (moe.py); on CUDA transformers' grouped_mm kernel
        moe.install(model)
    caches: list[LayerCache | None] = []
    for index, layer in enumerate(model.get_decoder().layers):
        mixer, layer_type = token_mixer(config, index, layer)
        kind = type(mixer).__name__
        if mixer is None:  # a Nemotron-H MLP / MoE block: no state across tokens
            caches.append(None)
            continue
        if getattr(mixer, "layer_idx", index) != index:
            raise NotImplementedError(f"NativeEngine: {family} layer {index}'s {kind} has layer_idx "
                                      f"{mixer.layer_idx}; {ELSEWHERE}")
        if kind in GATED_DELTA_NETS:
            recurrent.install_gated_delta_net(mixer)
            state = (mixer.num_v_heads, mixer.head_k_dim, mixer.head_v_dim)
            caches.append(RecurrentState(rows, mixer.conv_dim, mixer.conv_kernel_size, state, dtype, torch.float32,
                                         device))
        elif kind in MAMBA2_MIXERS:
            recurrent.install_mamba2(mixer)
            state = (mixer.num_heads, mixer.head_dim, mixer.ssm_state_size)
            caches.append(RecurrentState(rows, mixer.conv_dim, mixer.conv_kernel_size, state, dtype, torch.float32,
                                         device))
        elif kind in LATENT_ATTENTIONS:
            latent.install(mixer)
            caches.append(LatentKV(rows, max_seq_len, mixer.kv_lora_rank, mixer.qk_rope_head_dim, dtype, device))
        elif layer_type in SOFTMAX_LAYER_TYPES and _is_softmax_attention(mixer):
            window = config.sliding_window if layer_type == "sliding_attention" else None
            kv_heads = mixer.k_proj.out_features // mixer.head_dim
            caches.append(AttentionKV(rows, max_seq_len, kv_heads, mixer.head_dim, dtype, device, window))
        else:
            raise NotImplementedError(
                f"NativeEngine does not support {family} layer {index}: a {layer_type!r} layer ({kind}). It runs "
                "full / sliding-window softmax attention, multi-head latent attention (Glm4MoeLite), gated "
                f"delta-net linear attention (Qwen3.5) and Mamba-2 (Nemotron-H); {ELSEWHERE}"
            )
    return caches


def token_mixer(config, index: int, layer: nn.Module) -> tuple[nn.Module | None, str]:
    """(the module mixing tokens in decoder layer ``index``, its layer type)."""
    block_types = getattr(config, "layers_block_type", None)  # Nemotron-H: one mixer per block
    if block_types is not None:
        block = block_types[index]
        return (None, block) if block in ("mlp", "moe") else (layer.mixer, block)
    layer_types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
    for name in ("self_attn", "linear_attn", "mixer"):
        if isinstance(getattr(layer, name, None), nn.Module):
            return getattr(layer, name), layer_types[index]
    return layer, layer_types[index]


def _is_softmax_attention(module: nn.Module) -> bool:
    """Projects queries/keys/values and calls the attention interface with them (Llama-style)."""
    return all(isinstance(getattr(module, name, None), nn.Linear) for name in ("q_proj", "k_proj", "v_proj")) and \
        isinstance(getattr(module, "head_dim", None), int)
