"""FP8 on the Megatron backend: Transformer Engine's linears (extra ``rl-backends-train[megatron-fp8]``).

``policy.precision`` maps to megatron-core 0.16's ``TransformerConfig`` fields ``fp8`` (the format:
``hybrid`` = e4m3 forward, e5m2 gradients; or ``e4m3``) and ``fp8_recipe`` (``tensorwise`` current
scaling, ``delayed`` scaling from an amax history, ``blockwise``, ``mxfp8``). megatron-core's
``TransformerBlock`` then runs each layer inside Transformer Engine's FP8 autocast; only TE modules
compute in FP8, so ``with_te_linears`` puts TE's column/row-parallel linears into the local layer spec
in place of megatron-core's own: ``linear_qkv``, ``linear_proj``, and a dense MLP's ``linear_fc1`` /
``linear_fc2``. Their parameters keep the local spec's names and shapes (the norms stay separate
modules: no fused ``layer_norm_weight``), so the HF mapping, tensor-parallel shards, checkpoints and
refit are unchanged. The embedding, output layer and MoE experts stay in high precision. TE's
``_extra_state`` (delayed scaling's amax history) is not checkpointed: a resumed run rebuilds it.

Transformer Engine is CUDA-only: CPU ranks are refused before start.
"""

from __future__ import annotations

from rl_backends_train.config import PrecisionConfig, TrainBackendConfig
from rl_backends_train.fp8 import import_extra

TE_EXTRA_HINT = 'Please install "rl-backends-train[megatron-fp8]" (Transformer Engine) for policy.precision.linear=fp8'


def require_transformer_engine():
    """Transformer Engine's PyTorch modules, or one ImportError naming the extra."""
    return import_extra("transformer_engine.pytorch", f"{TE_EXTRA_HINT} with backend=megatron")


def transformer_config_fields(precision: PrecisionConfig | None) -> dict:
    """The ``TransformerConfig`` keyword arguments of ``precision`` (none unless ``linear: fp8``)."""
    if precision is None or precision.linear != "fp8":
        return {}
    return {"fp8": precision.fp8_format or "hybrid", "fp8_recipe": precision.recipe}


def with_te_linears(layer_spec):
    """``layer_spec`` (megatron-core's local GPT layer spec) with Transformer Engine's linears in the
    attention and in a dense MLP; same parameter names and shapes."""
    from megatron.core.extensions.transformer_engine import TEColumnParallelLinear, TERowParallelLinear
    from megatron.core.transformer.mlp import MLP

    attention = layer_spec.submodules.self_attention.submodules
    attention.linear_qkv = TEColumnParallelLinear
    attention.linear_proj = TERowParallelLinear
    mlp = layer_spec.submodules.mlp
    if mlp.module is MLP:  # a MoE layer's experts keep megatron-core's linears
        mlp.submodules.linear_fc1 = TEColumnParallelLinear
        mlp.submodules.linear_fc2 = TERowParallelLinear
    return layer_spec


def check_before_start(cfg: TrainBackendConfig) -> None:
    """In the driver: Transformer Engine importable, and the ranks on GPUs."""
    if cfg.precision.linear != "fp8":
        return
    require_transformer_engine()
    import torch

    on_cpu = cfg.gpus_per_worker == 0 if cfg.use_ray else not torch.cuda.is_available()
    if on_cpu:
        raise ValueError("policy.precision.linear=fp8 with backend=megatron runs Transformer Engine, which needs "
                         "CUDA GPUs (set policy.gpus_per_worker=1), or use backend=dtensor (torchao; emulated on CPU)")
