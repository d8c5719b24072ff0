"""HF <-> Megatron-core GPTModel parameter names and layouts for the Llama, Qwen2, Qwen3, Mixtral and
Qwen3-MoE families (``MAPPED_FAMILIES``; ``check_family`` refuses the others with the layer type that
megatron-core's GPT layer spec cannot express, and names the DTensor backend instead).

Megatron fuses what HF keeps apart:

* ``self_attention.linear_qkv.weight`` ``[G * (H/G + 2) * D, hidden]`` interleaves per query group
  ``g``: the ``H/G`` query heads of the group, then key head ``g``, then value head ``g`` (``G`` =
  num_key_value_heads, ``H`` = num_attention_heads, ``D`` = head_dim). Qwen2's q/k/v biases are
  fused the same way into ``linear_qkv.bias``.
* ``mlp.linear_fc1.weight`` ``[2 * intermediate, hidden]`` is ``cat([gate_proj, up_proj])``.
* Qwen3's per-head q/k RMSNorms (``self_attn.q_norm`` / ``k_norm``, ``[head_dim]``) are megatron-core's
  ``self_attention.q_layernorm`` / ``k_layernorm`` (``qk_layernorm``), unchanged.
* The norm before attention / MLP is ``linear_qkv.layer_norm_weight`` / ``linear_fc1.layer_norm_weight``
  with Transformer Engine's fused spec ("te") and ``input_layernorm.weight`` /
  ``pre_mlp_layernorm.weight`` with the local spec ("local"). Both are read; ``layer_spec`` picks
  which one is written.

Mixture-of-experts layers (Mixtral, Qwen3-MoE; megatron-core's local ``SequentialMLP``):

* the router ``mlp.router.weight`` ``[E, hidden]`` is HF's ``mlp.gate.weight`` (Mixtral on disk:
  ``block_sparse_moe.gate.weight``);
* expert ``j``'s ``mlp.experts.local_experts.{j}.linear_fc1.weight`` is ``cat([gate_j, up_j])`` and
  ``linear_fc2.weight`` its down projection. HF keeps the experts of a layer stacked in memory,
  ``mlp.experts.gate_up_proj`` ``[E, 2 * ffn, hidden]`` (gate rows first) and
  ``mlp.experts.down_proj`` ``[E, hidden, ffn]``, and per expert on disk (Mixtral:
  ``block_sparse_moe.experts.{j}.w1`` = gate, ``w3`` = up, ``w2`` = down; Qwen3-MoE:
  ``mlp.experts.{j}.gate_proj`` / ``up_proj`` / ``down_proj``). All spellings are read;
  the stacked in-memory one is written (``from_pretrained`` loads it, and it is what HF models and
  the generation engines hold, so refit names match).

Distributed checkpoints of megatron-core stack the layers: ``decoder.layers.<name>`` with a leading
``[num_layers]`` axis. ``megatron_to_hf`` accepts both the stacked and the per-layer
(``decoder.layers.{i}.<name>``) spelling, ``model.`` / ``module.`` prefixes, and the
``linear_fc1.weight_w`` / ``weight_v`` split some checkpoints use. ``_extra_state`` entries are ignored.
All operations are views, cats and index copies: a round trip is bit-exact, and they run on
``meta`` tensors to compute output shapes without data.
"""

from __future__ import annotations

import re
from typing import Literal

import torch

from rl_checkpoint.errors import CheckpointError

LayerSpec = Literal["local", "te"]

_NORM_NAMES = {
    "te": ("self_attention.linear_qkv.layer_norm_weight", "mlp.linear_fc1.layer_norm_weight"),
    "local": ("input_layernorm.weight", "pre_mlp_layernorm.weight"),
}
_DIRECT = {  # per-layer megatron suffix -> HF suffix (no layout change)
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "input_layernorm.weight": "input_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "post_attention_layernorm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
}
_LAYER_RE = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_EXPERT_RE = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.(linear_fc1|linear_fc2)\.weight$")
_HF_EXPERT_RE = re.compile(r"^(?:block_sparse_moe|mlp)\.experts\.(\d+)\.(w1|w2|w3|gate_proj|down_proj|up_proj)\.weight$")
_EXPERT_PART = {"w1": "gate", "w3": "up", "w2": "down", "gate_proj": "gate", "up_proj": "up", "down_proj": "down"}

MAPPED_FAMILIES = ("llama", "qwen2", "qwen3", "mixtral", "qwen3_moe")
"""HF ``model_type``s with a megatron-core GPTModel counterpart (local layer spec)."""
_UNMAPPED_LAYERS = {  # model_type -> the layers that have no counterpart in megatron-core's GPT layer spec here
    "qwen3_5": "gated delta-net linear-attention layers (a hybrid with full attention)",
    "qwen3_5_text": "gated delta-net linear-attention layers (a hybrid with full attention)",
    "qwen3_5_moe": "gated delta-net linear-attention layers (a hybrid with full attention)",
    "qwen3_5_moe_text": "gated delta-net linear-attention layers (a hybrid with full attention)",
    "qwen3_next": "gated delta-net linear-attention layers (a hybrid with full attention)",
    "nemotron_h": "Mamba-2 state-space layers (a hybrid with attention)",
    "glm4_moe_lite": "multi-head latent attention (MLA) layers and MoE with shared experts",
    "gemma3": "sliding-window attention layers (interleaved with global ones)",
    "gemma3_text": "sliding-window attention layers (interleaved with global ones)",
    "gpt_oss": "sliding-window attention layers with attention sinks",
}
_HF_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def check_family(hf_config: dict) -> None:
    """Raise one CheckpointError naming the family, its layer type and what to use instead, unless
    ``hf_config`` (an HF config dict) is of a family this mapping covers (``MAPPED_FAMILIES``)."""
    family = hf_config.get("model_type")
    if family is None or family in MAPPED_FAMILIES:
        return
    layers = _UNMAPPED_LAYERS.get(family, "layers")
    raise CheckpointError(
        f"{family}: its {layers} have no megatron-core GPTModel counterpart here (the Megatron backend and "
        f"this mapping cover {', '.join(MAPPED_FAMILIES)}); use the DTensor backend (policy.backend=dtensor), whose checkpoints "
        "rl-checkpoint converts without --megatron")


def _heads(hf_config: dict) -> tuple[int, int, int]:
    """(num_attention_heads, num_key_value_heads, head_dim) from an HF config dict."""
    heads = hf_config["num_attention_heads"]
    kv_heads = hf_config.get("num_key_value_heads") or heads
    head_dim = hf_config.get("head_dim") or hf_config["hidden_size"] // heads
    return heads, kv_heads, head_dim


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hf_config: dict) -> torch.Tensor:
    """HF q/k/v ([H*D, ...], [G*D, ...], [G*D, ...]) -> Megatron's per-group interleaved linear_qkv."""
    heads, groups, head_dim = _heads(hf_config)
    rest = q.shape[1:]
    q = q.reshape(groups, heads // groups * head_dim, *rest)
    k = k.reshape(groups, head_dim, *rest)
    v = v.reshape(groups, head_dim, *rest)
    return torch.cat([q, k, v], dim=1).reshape(-1, *rest)


def split_qkv(qkv: torch.Tensor, hf_config: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of ``fuse_qkv``."""
    heads, groups, head_dim = _heads(hf_config)
    per_group = heads // groups * head_dim
    rest = qkv.shape[1:]
    expected = groups * (per_group + 2 * head_dim)
    if qkv.shape[0] != expected:
        raise CheckpointError(
            f"linear_qkv has {qkv.shape[0]} rows but the HF config (heads={heads}, kv_heads={groups}, "
            f"head_dim={head_dim}) needs {expected}; pass the config of the model that was trained"
        )
    grouped = qkv.reshape(groups, per_group + 2 * head_dim, *rest)
    q, k, v = grouped.split([per_group, head_dim, head_dim], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def hf_to_megatron(state_dict: dict[str, torch.Tensor], hf_config: dict, *,
                   layer_spec: LayerSpec = "local") -> dict[str, torch.Tensor]:
    """HF tensors of a ``MAPPED_FAMILIES`` model -> megatron-core GPTModel tensors (per-layer names, no prefix)."""
    check_family(hf_config)
    attn_norm, mlp_norm = _NORM_NAMES[layer_spec]
    tied = bool(hf_config.get("tie_word_embeddings", False))
    out: dict[str, torch.Tensor] = {}
    layers: dict[int, dict[str, torch.Tensor]] = {}
    for name, tensor in state_dict.items():
        if name.endswith("rotary_emb.inv_freq"):
            continue
        m = _HF_LAYER_RE.match(name)
        if m:
            layers.setdefault(int(m.group(1)), {})[m.group(2)] = tensor
        elif name == "model.embed_tokens.weight":
            out["embedding.word_embeddings.weight"] = tensor
        elif name == "model.norm.weight":
            out["decoder.final_layernorm.weight"] = tensor
        elif name == "lm_head.weight":
            if not tied:
                out["output_layer.weight"] = tensor
        else:
            raise CheckpointError(f"HF tensor {name} has no Megatron counterpart (the mapped families: {', '.join(MAPPED_FAMILIES)})")
    for i, t in sorted(layers.items()):
        p = f"decoder.layers.{i}."
        attn = "self_attn."
        out[p + "self_attention.linear_qkv.weight"] = fuse_qkv(
            t.pop(attn + "q_proj.weight"), t.pop(attn + "k_proj.weight"), t.pop(attn + "v_proj.weight"), hf_config)
        if attn + "q_proj.bias" in t:
            out[p + "self_attention.linear_qkv.bias"] = fuse_qkv(
                t.pop(attn + "q_proj.bias"), t.pop(attn + "k_proj.bias"), t.pop(attn + "v_proj.bias"), hf_config)
        if "mlp.gate_proj.weight" in t:
            out[p + "mlp.linear_fc1.weight"] = torch.cat([t.pop("mlp.gate_proj.weight"), t.pop("mlp.up_proj.weight")])
            out[p + "mlp.linear_fc2.weight"] = t.pop("mlp.down_proj.weight")
        else:
            out |= {p + k: v for k, v in _experts_to_megatron(t, i).items()}
        out[p + attn_norm] = t.pop("input_layernorm.weight")
        out[p + mlp_norm] = t.pop("post_attention_layernorm.weight")
        out[p + "self_attention.linear_proj.weight"] = t.pop("self_attn.o_proj.weight")
        for hf_suffix, mg_suffix in (("self_attn.q_norm.weight", "self_attention.q_layernorm.weight"),
                                     ("self_attn.k_norm.weight", "self_attention.k_layernorm.weight")):
            if hf_suffix in t:
                out[p + mg_suffix] = t.pop(hf_suffix)
        if t:
            raise CheckpointError(f"HF tensors of layer {i} have no Megatron counterpart: {sorted(t)}")
    return out


def _experts_to_megatron(t: dict[str, torch.Tensor], layer: int) -> dict[str, torch.Tensor]:
    """Pop a mixture-of-experts layer's HF tensors (stacked or per-expert) from ``t``; return the
    router and every expert's ``linear_fc1`` / ``linear_fc2`` under Megatron's per-layer suffixes."""
    out = {}
    router = t.pop("mlp.gate.weight", None)
    if router is None:
        router = t.pop("block_sparse_moe.gate.weight", None)
    if router is None:
        raise CheckpointError(f"HF layer {layer} has neither an MLP (mlp.gate_proj) nor a router (mlp.gate / "
                              "block_sparse_moe.gate): not a layer of the mapped families")
    out["mlp.router.weight"] = router
    if "mlp.experts.gate_up_proj" in t:
        for j, (gate_up, down) in enumerate(zip(t.pop("mlp.experts.gate_up_proj"), t.pop("mlp.experts.down_proj"),
                                                strict=True)):
            out[f"mlp.experts.local_experts.{j}.linear_fc1.weight"] = gate_up
            out[f"mlp.experts.local_experts.{j}.linear_fc2.weight"] = down
        return out
    per_expert: dict[int, dict[str, torch.Tensor]] = {}
    for suffix in [k for k in t if _HF_EXPERT_RE.match(k)]:
        m = _HF_EXPERT_RE.match(suffix)
        per_expert.setdefault(int(m.group(1)), {})[_EXPERT_PART[m.group(2)]] = t.pop(suffix)
    if sorted(per_expert) != list(range(router.shape[0])):
        raise CheckpointError(f"HF layer {layer}: the router has {router.shape[0]} experts but the tensors hold "
                              f"experts {sorted(per_expert)}")
    for j, w in sorted(per_expert.items()):
        out[f"mlp.experts.local_experts.{j}.linear_fc1.weight"] = torch.cat([w["gate"], w["up"]])
        out[f"mlp.experts.local_experts.{j}.linear_fc2.weight"] = w["down"]
    return out


def _experts_to_hf(t: dict[str, torch.Tensor], layer: int) -> dict[str, torch.Tensor]:
    """Pop a mixture-of-experts layer's Megatron tensors from ``t``; return HF's in-memory layout
    (router ``mlp.gate.weight``, experts stacked in ``mlp.experts.gate_up_proj`` / ``down_proj``)."""
    fc1: dict[int, torch.Tensor] = {}
    fc2: dict[int, torch.Tensor] = {}
    for suffix in [k for k in t if _EXPERT_RE.match(k)]:
        m = _EXPERT_RE.match(suffix)
        (fc1 if m.group(2) == "linear_fc1" else fc2)[int(m.group(1))] = t.pop(suffix)
    router = t.pop("mlp.router.weight")
    experts = list(range(router.shape[0]))
    if sorted(fc1) != experts or sorted(fc2) != experts:
        raise CheckpointError(f"Megatron layer {layer}: the router has {router.shape[0]} experts but the tensors "
                              f"hold experts {sorted(fc1)} (linear_fc1) and {sorted(fc2)} (linear_fc2); gather "
                              "every expert-parallel rank's experts first")
    return {"mlp.gate.weight": router,
            "mlp.experts.gate_up_proj": torch.stack([fc1[j] for j in experts]),
            "mlp.experts.down_proj": torch.stack([fc2[j] for j in experts])}


def strip_prefixes(name: str) -> str:
    """``module.model.decoder...`` -> ``decoder...`` (DDP / Float16Module / NeMo wrappers)."""
    while True:
        for prefix in ("module.", "model."):
            if name.startswith(prefix) and not name.startswith("model.layers."):
                name = name[len(prefix):]
                break
        else:
            return name


def unstack_layers(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``decoder.layers.<name>`` [L, ...] (distributed-checkpoint layout) -> ``decoder.layers.{i}.<name>``."""
    out = {}
    for name, tensor in state_dict.items():
        if name.startswith("decoder.layers.") and not _LAYER_RE.match(name):
            suffix = name[len("decoder.layers."):]
            for i in range(tensor.shape[0]):
                out[f"decoder.layers.{i}.{suffix}"] = tensor[i]
        else:
            out[name] = tensor
    return out


def megatron_to_hf(state_dict: dict[str, torch.Tensor], hf_config: dict) -> dict[str, torch.Tensor]:
    """megatron-core GPTModel tensors (stacked or per-layer, any prefix) -> HF tensors of a ``MAPPED_FAMILIES`` model."""
    check_family(hf_config)
    sd = unstack_layers({strip_prefixes(k): v for k, v in state_dict.items() if not k.endswith("_extra_state")})
    tied = bool(hf_config.get("tie_word_embeddings", False))
    out: dict[str, torch.Tensor] = {}
    layers: dict[int, dict[str, torch.Tensor]] = {}
    for name, tensor in sd.items():
        m = _LAYER_RE.match(name)
        if m:
            layers.setdefault(int(m.group(1)), {})[m.group(2)] = tensor
        elif name == "embedding.word_embeddings.weight":
            out["model.embed_tokens.weight"] = tensor
        elif name == "decoder.final_layernorm.weight":
            out["model.norm.weight"] = tensor
        elif name == "output_layer.weight":
            if not tied:
                out["lm_head.weight"] = tensor
        else:
            raise CheckpointError(f"Megatron tensor {name} has no HF counterpart (the mapped families: {', '.join(MAPPED_FAMILIES)})")
    if not tied and "lm_head.weight" not in out and "model.embed_tokens.weight" in out:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]  # shared in Megatron, separate in this HF config
    for i, t in sorted(layers.items()):
        p = f"model.layers.{i}."
        q, k, v = split_qkv(t.pop("self_attention.linear_qkv.weight"), hf_config)
        out |= {p + "self_attn.q_proj.weight": q, p + "self_attn.k_proj.weight": k, p + "self_attn.v_proj.weight": v}
        if "self_attention.linear_qkv.bias" in t:
            q, k, v = split_qkv(t.pop("self_attention.linear_qkv.bias"), hf_config)
            out |= {p + "self_attn.q_proj.bias": q, p + "self_attn.k_proj.bias": k, p + "self_attn.v_proj.bias": v}
        if "mlp.router.weight" in t:
            out |= {p + k: v for k, v in _experts_to_hf(t, i).items()}
        elif "mlp.linear_fc1.weight" in t:
            gate, up = t.pop("mlp.linear_fc1.weight").chunk(2, dim=0)
            out |= {p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up}
        else:
            gate, up = t.pop("mlp.linear_fc1.weight_w"), t.pop("mlp.linear_fc1.weight_v")
            out |= {p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up}
        for mg_suffix in list(t):
            if mg_suffix in _DIRECT:
                out[p + _DIRECT[mg_suffix]] = t.pop(mg_suffix)
        if t:
            raise CheckpointError(f"Megatron tensors of layer {i} have no HF counterpart: {sorted(t)}")
    return out
