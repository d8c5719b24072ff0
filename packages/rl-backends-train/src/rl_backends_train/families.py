"""What the DTensor backend needs to know per model family (HF ``model_type``).

* Tensor parallel: HF's own ``config.base_model_tp_plan`` translated to torch ``ParallelStyle``s; a
  family without a plan, or whose plan uses a style not translated here (packed MoE experts, the
  MLA latent projection), is refused with the alternatives.
* Packing: packed sequences share one row; a recurrent layer (gated delta-net, Mamba-2) would carry
  its state from one sequence into the next, so packing is refused for families that have one.
  Sliding-window layers get their own packed mask (block-diagonal, causal and within the window).
* LoRA: the adapted ``nn.Linear`` names when ``lora.target_modules`` is not set, and an error listing
  the family's Linear names for a target that matches none.
"""

from __future__ import annotations

import torch
from torch import nn

from rl_core.config import ConfigError, ConfigProblem

STANDARD_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ATTENTION_ONLY = ("q_proj", "k_proj", "v_proj", "o_proj")  # MoE experts are 3-D parameters, not Linears
LORA_TARGETS: dict[str, tuple[str, ...]] = {
    "mixtral": ATTENTION_ONLY,
    "qwen3_moe": ATTENTION_ONLY,
    "gpt_oss": ATTENTION_ONLY,
    "qwen3_5_text": STANDARD_LORA_TARGETS + ("in_proj_qkv", "in_proj_z", "out_proj"),
    "qwen3_5_moe_text": STANDARD_LORA_TARGETS + ("in_proj_qkv", "in_proj_z", "out_proj"),  # MLP: shared expert
    "glm4_moe_lite": ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "gate_proj", "up_proj",
                      "down_proj"),
    "nemotron_h": ATTENTION_ONLY + ("in_proj", "out_proj", "up_proj", "down_proj"),
}
RECURRENT_LAYER_TYPES = {"linear_attention"}  # Qwen3.5 gated delta-net, Nemotron-H Mamba-2
# Sequence parallel re-lays the decoder layer's norms and blocks (dtensor/parallelize.py), Llama-style.
SEQUENCE_PARALLEL_FAMILIES = ("llama", "qwen2", "qwen3", "mistral")


def layer_types(config) -> list[str]:
    """The kind of every decoder layer (``full_attention``, ``sliding_attention``, ``linear_attention``...);
    of a vision-language model, its language model's."""
    config = config.get_text_config()
    return list(getattr(config, "layers_block_type", None) or getattr(config, "layer_types", None)
                or ["full_attention"] * config.num_hidden_layers)


def check_training_layout(config, cfg) -> None:
    """Refuse layouts the family's layers do not allow (``cfg``: a TrainBackendConfig)."""
    family = config.model_type
    recurrent = sorted(set(layer_types(config)) & RECURRENT_LAYER_TYPES)
    if cfg.packing.enabled and recurrent:
        raise ValueError(
            f"packing.enabled=true is not supported for {family}: its {recurrent} layers (gated delta-net / "
            "Mamba-2 recurrences) would carry their state from one packed sequence into the next; set "
            "packing.enabled=false (dynamic_batching.enabled=true also cuts padding)")
    if cfg.sequence_parallel and family not in SEQUENCE_PARALLEL_FAMILIES:
        raise ValueError(f"sequence_parallel=true has plans for {SEQUENCE_PARALLEL_FAMILIES}, not {family}; set "
                         "sequence_parallel=false (tensor parallel alone) or use activation_checkpointing")


def tensor_parallel_layer_plan(config) -> dict:
    """The per-decoder-layer plan ``{submodule name: ParallelStyle}`` from ``base_model_tp_plan``."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    styles = {
        "colwise": ColwiseParallel,
        "rowwise": RowwiseParallel,
        "colwise_gather_output": lambda: ColwiseParallel(output_layouts=Replicate()),
        # A norm over the last dim of head-sharded activations (q_norm/k_norm): its weight is
        # replicated and its gradient summed over the ranks; any non-normalised dim may be the shard.
        "replicated_with_grad_allreduce": lambda: SequenceParallel(sequence_dim=0, use_local_output=True),
    }
    family = config.model_type
    plan = getattr(config, "base_model_tp_plan", None)
    if not plan:
        raise ValueError(f"tensor parallel: {family} has no base_model_tp_plan in its transformers config; set "
                         f"tensor_parallel_size=1 (FSDP shards every layer){_megatron_hint(family)}")
    layer_plan = {}
    for pattern, style in plan.items():
        if style == "embedding_rowwise":
            continue  # the embeddings stay replicated (they may be tied to the LM head)
        if not pattern.startswith("layers.*.") or style not in styles:
            raise ValueError(
                f"tensor parallel: {family}'s base_model_tp_plan shards {pattern!r} as {style!r}, which the dtensor "
                f"backend does not translate (it translates {sorted(styles)}); set tensor_parallel_size=1 (FSDP "
                f"shards every layer){_megatron_hint(family)}")
        layer_plan[pattern.removeprefix("layers.*.")] = styles[style]()
    return layer_plan


def _megatron_hint(family: str) -> str:
    """" or backend=megatron" where the Megatron backend builds ``family`` (rl-checkpoint's mapped families, an
    install of its ``megatron`` extra), else ""."""
    try:
        from rl_checkpoint.megatron_mapping import MAPPED_FAMILIES
    except ImportError:  # without the extra there is no Megatron backend to suggest
        return ""
    return " or backend=megatron" if family in MAPPED_FAMILIES else ""


def check_tensor_parallel_sizes(layer: nn.Module, plan: dict, tp: int) -> None:
    """Every Linear the plan shards must split evenly over ``tp`` ranks (whole heads per rank)."""
    from torch.distributed.tensor.parallel import RowwiseParallel

    for name, style in plan.items():
        module = layer.get_submodule(name)
        if isinstance(module, nn.Linear):
            size = module.in_features if isinstance(style, RowwiseParallel) else module.out_features
            if size % tp:
                raise ValueError(f"tensor_parallel_size={tp} must divide {name}'s sharded size {size}")


def lora_targets(model: nn.Module, configured: list[str] | None) -> set[str]:
    """The Linear names to adapt: ``configured``, each of which must name a Linear of the model, or
    (None) the family's default list."""
    family = model.config.model_type
    linears = {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if type(m) is nn.Linear}
    linears.discard("lm_head")
    targets = set(configured) if configured is not None else set(LORA_TARGETS.get(family, STANDARD_LORA_TARGETS))
    missing = sorted(targets - linears)
    if missing:
        raise ConfigError(ConfigProblem("config", "policy.lora.target_modules",
                                        f"{missing} match no nn.Linear of {family}; its Linear names are "
                                        f"{sorted(linears)}"))
    return targets


def packed_attention_mask(model: nn.Module, mask: torch.Tensor, position_ids: torch.Tensor):
    """The packed ``[1, 1, L, L]`` bool mask (True = may attend) as ``model`` takes it: additive (0 /
    min) for eager attention, which adds the mask to the scores; and for a family with sliding-window
    layers one mask per layer type (HF models accept the mapping), the sliding one also limited to keys
    within the window (by position: a shared prompt and its answers continue one position sequence)."""
    config = model.config
    if getattr(config, "_attn_implementation", None) == "eager":
        dtype = next(model.parameters()).dtype
        as_model_takes = lambda m: torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill(  # noqa: E731
            ~m, torch.finfo(dtype).min)
    else:
        as_model_takes = lambda m: m  # noqa: E731
    if "sliding_attention" not in layer_types(config):
        return as_model_takes(mask)
    positions = position_ids[0]
    within = positions[None, :] > positions[:, None] - config.sliding_window  # [L, L]
    return {"full_attention": as_model_takes(mask), "sliding_attention": as_model_takes(mask & within[None, None])}
