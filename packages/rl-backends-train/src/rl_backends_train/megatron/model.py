"""A megatron-core GPTModel built from an HF Llama/Qwen2 config, wearing an HF-style interface.

``MegatronCausalLM.forward(input_ids, attention_mask, position_ids)`` returns an object with
``.logits`` like an HF causal LM, so micro-batching, packing and the logprob code are shared with
the DTensor backend. Masks: a 2-D padding mask (right padding) becomes Megatron's causal mask; a
4-D boolean packing mask (True = may attend) is inverted to Megatron's True = masked out.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

_FAMILIES = ("llama", "qwen2")


def rope_theta(config) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def transformer_config(hf_config, dtype: torch.dtype):
    """megatron-core TransformerConfig equal to the HF model (RMSNorm, SwiGLU, RoPE, GQA)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    if hf_config.model_type not in _FAMILIES:
        raise ValueError(f"the Megatron backend maps {_FAMILIES} models, not {hf_config.model_type!r}")
    if (getattr(hf_config, "rope_parameters", None) or {}).get("rope_type", "default") != "default":
        raise ValueError("the Megatron backend supports plain RoPE only (no rope scaling)")
    heads = hf_config.num_attention_heads
    return TransformerConfig(
        num_layers=hf_config.num_hidden_layers,
        hidden_size=hf_config.hidden_size,
        num_attention_heads=heads,
        num_query_groups=getattr(hf_config, "num_key_value_heads", None) or heads,
        kv_channels=getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads,
        ffn_hidden_size=hf_config.intermediate_size,
        normalization="RMSNorm",
        layernorm_epsilon=hf_config.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=hf_config.model_type == "qwen2",
        attention_dropout=0.0,
        hidden_dropout=0.0,
        # No fused CUDA kernels: the same math runs on CPU and GPU.
        bias_activation_fusion=False,
        apply_rope_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        params_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        use_cpu_initialization=True,
    )


class MegatronCausalLM(nn.Module):
    """A GPTModel (local layer spec, TP = PP = 1) with an HF causal-LM calling convention."""

    def __init__(self, hf_config, dtype: torch.dtype) -> None:
        super().__init__()
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

        self.config = hf_config
        self.gpt = GPTModel(
            transformer_config(hf_config, dtype),
            get_gpt_layer_local_spec(normalization="RMSNorm"),
            vocab_size=hf_config.vocab_size,
            max_sequence_length=hf_config.max_position_embeddings,
            position_embedding_type="rope",
            rotary_base=int(rope_theta(hf_config)),
            share_embeddings_and_output_weights=bool(hf_config.tie_word_embeddings),
        )

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> SimpleNamespace:
        b, t = input_ids.shape
        if attention_mask is not None and attention_mask.dim() == 4:
            masked_out = ~attention_mask.bool()  # [b, 1, t, t]
        else:
            # Right padding: the causal mask alone keeps real tokens from seeing padding.
            masked_out = torch.ones(t, t, dtype=torch.bool, device=input_ids.device).triu(1)[None, None]
        if position_ids is None:
            position_ids = torch.arange(t, device=input_ids.device)[None].expand(b, -1)
        logits = self.gpt(input_ids, position_ids, masked_out.expand(b, 1, t, t))
        return SimpleNamespace(logits=logits)

    # HF names <-> Megatron names through rl_checkpoint's mapping (the converter's, shared).
    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        from rl_checkpoint.megatron_mapping import megatron_to_hf

        own = {k: v for k, v in self.gpt.state_dict().items() if not k.endswith("_extra_state")}
        return megatron_to_hf(own, self.config.to_dict())

    def load_hf_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        from rl_checkpoint.megatron_mapping import hf_to_megatron

        mapped = hf_to_megatron(state_dict, self.config.to_dict())
        missing, unexpected = self.gpt.load_state_dict(mapped, strict=False)
        missing = [k for k in missing if not k.endswith("_extra_state")]
        if missing or unexpected:
            raise RuntimeError(f"HF weights do not fit the GPTModel: missing {missing}, unexpected {unexpected}")
