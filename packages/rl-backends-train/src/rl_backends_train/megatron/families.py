"""The HF families the Megatron backend builds, and the megatron-core ``TransformerConfig`` of each.

Every family is RMSNorm + SwiGLU + RoPE + grouped-query attention (megatron-core's local layer spec);
what differs:

* ``llama``: nothing more; ``qwen2``: q/k/v biases (``add_qkv_bias``);
* ``qwen3``: a per-head RMSNorm on queries and keys before RoPE (HF ``q_norm`` / ``k_norm``, megatron-core's
  ``qk_layernorm``; their weights are replicated over tensor-parallel ranks, each of which normalises
  its own heads, so ``grads.reduce_gradients`` sums their gradients over the TP group);
* ``mixtral``: a mixture of experts in every layer; ``qwen3_moe``: Qwen3's attention and a mixture of
  ``num_experts`` experts of ``moe_intermediate_size`` (no shared expert).

Routing as HF: softmax over all experts, top k, renormalised over those k when the config says so
(Mixtral always; Qwen3-MoE with ``norm_topk_prob``). Renormalised, that is exactly megatron-core's
softmax over the top-k logits (``moe_router_pre_softmax=False``); not renormalised, megatron-core's
softmax before top-k (``moe_router_pre_softmax=True``). No load-balancing loss, no token dropping.

Other families are refused (``check_family``) with the layer type that has no counterpart, naming the
DTensor backend: the mapping's list (``rl_checkpoint.megatron_mapping``) is the one source.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rl_backends_train.megatron import experts

_QK_NORM = ("qwen3", "qwen3_moe")


def check_family(hf_config) -> None:
    """ValueError unless the backend builds ``hf_config``'s family (in the driver, before any worker)."""
    from rl_checkpoint.megatron_mapping import check_family as mapped

    mapped(hf_config.to_dict())
    if (getattr(hf_config, "rope_parameters", None) or {}).get("rope_type", "default") != "default":
        raise ValueError("the Megatron backend supports plain RoPE only (no rope scaling)")
    if getattr(hf_config, "sliding_window", None) is not None and (
            hf_config.model_type == "mixtral" or getattr(hf_config, "use_sliding_window", False)):
        raise ValueError(f"the Megatron backend runs full attention; this {hf_config.model_type} config sets "
                         f"sliding_window={hf_config.sliding_window}: use policy.backend=dtensor")
    if getattr(hf_config, "router_jitter_noise", 0.0):
        raise ValueError("the Megatron backend's router has no jitter noise; this config sets router_jitter_noise="
                         f"{hf_config.router_jitter_noise}")
    dense = getattr(hf_config, "mlp_only_layers", None) or []
    if hf_config.model_type == "qwen3_moe" and (dense or getattr(hf_config, "decoder_sparse_step", 1) != 1):
        raise ValueError(f"qwen3_moe with dense MLP layers (mlp_only_layers={dense}, decoder_sparse_step="
                         f"{hf_config.decoder_sparse_step}) is not built by the Megatron backend (every layer must "
                         "be a mixture of experts); use policy.backend=dtensor")


def rope_theta(config) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def qk_layernorm(hf_config) -> bool:
    return hf_config.model_type in _QK_NORM


def moe_settings(hf_config, expert_parallel_size: int) -> dict:
    """TransformerConfig keys of a mixture-of-experts family (empty for a dense one)."""
    count = experts.num_experts(hf_config)
    if not count:
        return {}
    renormalised = hf_config.model_type == "mixtral" or bool(getattr(hf_config, "norm_topk_prob", False))
    return {
        "num_moe_experts": count,
        "moe_router_topk": hf_config.num_experts_per_tok,
        "moe_ffn_hidden_size": getattr(hf_config, "moe_intermediate_size", None) or hf_config.intermediate_size,
        "moe_router_score_function": "softmax",
        "moe_router_pre_softmax": not renormalised,
        "moe_router_load_balancing_type": "none",
        "moe_aux_loss_coeff": 0.0,
        "moe_token_dispatcher_type": "alltoall",
        "moe_grouped_gemm": False,
        "expert_model_parallel_size": expert_parallel_size,
    }


def transformer_config(hf_config, dtype: torch.dtype, *, tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1,
                       context_parallel_size: int = 1, expert_parallel_size: int = 1, recompute: bool = False,
                       virtual_pipeline_size: int = 1, sequence_parallel: bool = False, quantization: dict | None = None):
    """megatron-core TransformerConfig equal to the HF model (RMSNorm, SwiGLU, RoPE, GQA; per family above).

    ``recompute``: Megatron's full recompute of every decoder layer in backward (``uniform``, one
    layer per unit), the same granularity as the DTensor backend's activation checkpointing.
    ``pipeline_parallel_size > 1``: the settings ``megatron/pipeline.py`` runs the schedule with.
    ``quantization``: FP8 fields (``fp8.transformer_config_fields``)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    check_family(hf_config)
    heads = hf_config.num_attention_heads
    recompute_kwargs = {}
    if recompute:
        recompute_kwargs = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
    pipeline_kwargs = {}
    if pipeline_parallel_size > 1:
        pipeline_kwargs = {
            "pipeline_model_parallel_size": pipeline_parallel_size,
            "pipeline_dtype": dtype,
            # Micro-batches differ in length and rows: stages send the activation's shape first.
            "variable_seq_lengths": True,
            # No MoE layers; TransformerConfig rejects its default dispatcher with variable lengths.
            "moe_token_dispatcher_type": "alltoall",
            # Losses are already divided by global counts: the schedule must not divide them again
            # (by the number of micro-batches, or by a token count).
            "calculate_per_token_loss": True,
        }
        if virtual_pipeline_size > 1:
            pipeline_kwargs["virtual_pipeline_model_parallel_size"] = virtual_pipeline_size
    return TransformerConfig(
        tensor_model_parallel_size=tensor_parallel_size,
        sequence_parallel=sequence_parallel,
        context_parallel_size=context_parallel_size,
        num_layers=hf_config.num_hidden_layers,
        hidden_size=hf_config.hidden_size,
        num_attention_heads=heads,
        num_query_groups=getattr(hf_config, "num_key_value_heads", None) or heads,
        kv_channels=getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads,
        ffn_hidden_size=hf_config.intermediate_size,
        normalization="RMSNorm",
        layernorm_epsilon=hf_config.rms_norm_eps,
        qk_layernorm=qk_layernorm(hf_config),
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
        **recompute_kwargs,
        **(pipeline_kwargs | moe_settings(hf_config, expert_parallel_size) | (quantization or {})),
    )
