"""Build one rank's shard of an HF model: load, then LoRA -> FP8 linears -> tensor parallel -> activation
checkpointing -> FSDP2, in that order (each step needs the previous one's module structure:
TP plans address plain Linear names, checkpointing wraps whole decoder layers whose parameters
are final, and FSDP2 shards whatever DTensors/tensors the earlier steps left)."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from rl_backends_train import router_replay, vision
from rl_backends_train.config import TrainBackendConfig
from rl_backends_train.families import check_tensor_parallel_sizes, check_training_layout, tensor_parallel_layer_plan
from rl_backends_train.fp8 import convert_linears_to_fp8
from rl_backends_train.lora import apply_lora
from rl_core.models.processor import is_vision_language_model

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def build_mesh(cfg: TrainBackendConfig, device_type: str) -> DeviceMesh:
    """A 2-D ("dp", "tp") mesh over all ranks; tp varies fastest (neighbouring ranks share a layer)."""
    return init_device_mesh(device_type, (cfg.data_parallel_size, cfg.tensor_parallel_size), mesh_dim_names=("dp", "tp"))


def load_hf_model(model_path: str, cfg: TrainBackendConfig) -> nn.Module:
    """The full HF model on CPU, in fp32: the master weights (with bf16, FSDP casts them for compute)."""
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoModelForImageTextToText,
        AutoModelForSequenceClassification,
    )

    dtype = torch.float32
    if is_vision_language_model(model_path):
        model = AutoModelForImageTextToText.from_pretrained(model_path, dtype=dtype)
    elif cfg.task == "reward_model":
        config = AutoConfig.from_pretrained(model_path, num_labels=1)
        if config.pad_token_id is None:
            # HF pools the score at the last non-pad token and needs a pad id to find it.
            config.pad_token_id = config.eos_token_id if isinstance(config.eos_token_id, int) else 0
        model = AutoModelForSequenceClassification.from_pretrained(model_path, config=config, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
    return model


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layers of the (language) model."""
    parts = vision.vision_parts(model)
    base = parts.language_model if parts else getattr(model, getattr(model, "base_model_prefix", "model"), None)
    layers = getattr(base, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f"{type(model).__name__}: expected decoder layers at .model.layers")
    return layers


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh, sequence_parallel: bool = False) -> None:
    """Megatron-style plan per decoder layer, from HF's ``base_model_tp_plan`` (``families.py``): e.g.
    q/k/v and gate/up column-wise, o/down row-wise (one all-reduce after attention and one after the
    MLP). lm_head column-wise with replicated (gathered) logits unless tied to the embeddings.
    Embeddings and norms stay replicated.

    ``sequence_parallel``: see ``_sequence_parallel_plans``."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    config = model.config
    tp = tp_mesh.size()
    layer_plan = tensor_parallel_layer_plan(config)  # refuses a family without a translatable plan first
    kv_heads = getattr(config, "num_key_value_heads", config.num_attention_heads)
    if config.num_attention_heads % tp or kv_heads % tp:
        raise ValueError(
            f"tensor_parallel_size={tp} must divide num_attention_heads={config.num_attention_heads} "
            f"and num_key_value_heads={kv_heads}"
        )
    if sequence_parallel:
        layer_plan, model_plan = _sequence_parallel_plans(model)
    else:
        model_plan = {}
        if hasattr(model, "lm_head") and not config.tie_word_embeddings:
            model_plan["lm_head"] = ColwiseParallel(output_layouts=Replicate())
    for layer in decoder_layers(model):
        plan = {name: style for name, style in layer_plan.items() if _has_submodule(layer, name)}
        check_tensor_parallel_sizes(layer, plan, tp)
        parallelize_module(layer, tp_mesh, plan)
    if model_plan:
        parallelize_module(model, tp_mesh, model_plan)


def _has_submodule(module: nn.Module, name: str) -> bool:
    try:
        module.get_submodule(name)
    except AttributeError:
        return False
    return True


def _sequence_parallel_plans(model: nn.Module) -> tuple[dict, dict]:
    """(per-layer plan, whole-model plan) of tensor + sequence parallelism.

    Between the blocks, the residual stream ``[b, t, h]`` is a DTensor sharded on the sequence
    (``Shard(1)``; t need not divide by tp): the embedding output is split (no communication), each
    RMSNorm runs on its t/tp rows (``SequenceParallel``, weights replicated), each block all-gathers
    its input to full length (attention needs every position), and the row-wise o/down projections
    reduce-scatter their partial sums back to ``Shard(1)`` instead of all-reducing them. The stream
    stays a DTensor, not a local tensor, so HF's mask and position code read the global shape and
    the head's ``logits_to_keep`` slice picks global positions. The head gathers the sequence."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
    )

    seq, full = Shard(1), Replicate()
    layer_plan = {
        "input_layernorm": SequenceParallel(),
        # LlamaDecoderLayer calls self_attn with keyword arguments, the MLP positionally.
        "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": seq},
                                        desired_input_kwarg_layouts={"hidden_states": full}, use_local_output=True),
        "self_attn.q_proj": ColwiseParallel(),
        "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(),
        "self_attn.o_proj": RowwiseParallel(output_layouts=seq, use_local_output=False),
        "post_attention_layernorm": SequenceParallel(),
        "mlp": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(full,), use_local_output=True),
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(output_layouts=seq, use_local_output=False),
    }
    prefix = getattr(model, "base_model_prefix", "model")
    model_plan = {
        f"{prefix}.embed_tokens": PrepareModuleOutput(output_layouts=full, desired_output_layouts=seq,
                                                      use_local_output=False),
        f"{prefix}.norm": SequenceParallel(),
    }
    head = "score" if hasattr(model, "score") else "lm_head"
    if head == "lm_head" and not model.config.tie_word_embeddings:
        model_plan[head] = ColwiseParallel(input_layouts=seq, output_layouts=full)
    else:  # a replicated head (tied lm_head, reward score) gets the gathered, local hidden states
        model_plan[head] = PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(full,), use_local_output=True)
    return layer_plan, model_plan


def apply_fsdp(model: nn.Module, dp_mesh: DeviceMesh, cfg: TrainBackendConfig, on_gpu: bool) -> None:
    """FSDP2 over "dp": each decoder layer its own unit (all-gathered just in time), then the root
    (embeddings, final norm, head); a vision-language model also each vision block and each image-only module
    (``vision.py``). Mixed precision: fp32 parameters (the masters the optimizer steps),
    compute in ``cfg.dtype``, gradients reduced in fp32 (CPU and GPU alike). On GPU optional CPU offload."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    kwargs: dict = {"mesh": dp_mesh,
                    "mp_policy": MixedPrecisionPolicy(param_dtype=_DTYPES[cfg.dtype], reduce_dtype=torch.float32)}
    if on_gpu:
        kwargs["offload_policy"] = CPUOffloadPolicy() if cfg.cpu_offload else OffloadPolicy()
    units = list(decoder_layers(model))
    if (parts := vision.vision_parts(model)) is not None:  # inner units first: blocks, then their modules
        units += vision.image_blocks(parts) + list(parts.image_modules.values())
    for unit in units:
        fully_shard(unit, **kwargs)
    fully_shard(model, **kwargs)
    # Losses are already divided by GLOBAL counts: gradients must be summed over ranks, not averaged.
    # Plain SUM collectives (gloo has no PREMUL_SUM).
    for module in model.modules():
        if hasattr(module, "set_gradient_divide_factor"):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)


def build_parallel_model(model_path: str, cfg: TrainBackendConfig, mesh: DeviceMesh, *, on_gpu: bool,
                         trainable: bool = True) -> nn.Module:
    """Load the HF model and parallelise it in the one order this backend uses."""
    model = load_hf_model(model_path, cfg)
    check_training_layout(model.config, cfg)
    if cfg.moe.router_replay:  # MoE routers that replay the generation's experts (router_replay.py)
        router_replay.install(model)
    parts = vision.vision_parts(model)
    # 1. LoRA: swap targeted Linears (of the language model) for LoRALinear while the module tree is plain.
    if trainable and cfg.lora is not None:
        apply_lora(model, cfg.lora, within=parts.language_prefix if parts else None)
    if trainable and cfg.freeze_vision:
        vision.freeze_image_modules(model)
    # An fp32 CPU run with one data shard skips FSDP (step 4): sharding over one rank only adds copies
    # (with bf16, or on GPU, it still brings mixed precision, and offload).
    use_fsdp = on_gpu or cfg.data_parallel_size > 1 or cfg.dtype != "float32"
    # 1b. FP8: eligible Linears become torchao Float8Linears (fp8.py), before FSDP shards their weights.
    if cfg.precision.linear == "fp8":
        device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
        convert_linears_to_fp8(model, cfg.precision, device, fsdp=use_fsdp)
    if not trainable:
        model.requires_grad_(False)
    if on_gpu and not cfg.cpu_offload:
        model.to(torch.device("cuda", torch.cuda.current_device()))
    # 2. Tensor parallel over "tp" (plain Linear weights become Shard(0)/Shard(1) DTensors; with
    #    sequence parallel the norms' weights become replicated DTensors).
    if cfg.tensor_parallel_size > 1:
        apply_tensor_parallel(model, mesh["tp"], sequence_parallel=cfg.sequence_parallel)
    # 3. Activation checkpointing per decoder layer (HF's non-reentrant checkpointing keeps FQNs).
    if trainable and cfg.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    # 4. FSDP2 over "dp" (see use_fsdp above).
    if use_fsdp:
        apply_fsdp(model, mesh["dp"], cfg, on_gpu)
    return model
