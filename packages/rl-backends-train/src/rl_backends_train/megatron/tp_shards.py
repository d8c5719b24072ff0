"""Full megatron-core GPTModel tensors <-> one tensor-parallel rank's shards, and the logits gather.

megatron-core's tensor-parallel layout (local layer spec, no sequence parallel):

* column-parallel / vocab-parallel, split on dim 0: ``word_embeddings``, ``output_layer``,
  ``linear_qkv`` (weight and Qwen2's bias; its per-query-group interleaving makes a contiguous
  split give each rank whole groups);
* row-parallel, split on dim 1: ``linear_proj``, ``linear_fc2``;
* ``linear_fc1`` = ``cat([gate, up])``: rank r holds ``cat([gate_r, up_r])``, each half split on dim 0;
* LoRA adapters (``<linear>.lora.<proj>.lora_A/B.weight``, see ``megatron/lora.py``) follow their
  base weight: B split on dim 0 under the column-parallel ``linear_qkv`` / ``linear_fc1``, A split on
  dim 1 under the row-parallel ``linear_proj`` / ``linear_fc2``; the other factor is replicated;
* everything else (the RMSNorm weights) is replicated.

In checkpoints (flattened optimizer state dicts), optimizer state of a sharded parameter is a DTensor ``Shard(dim)`` over the
tensor-parallel mesh, so DCP reshards it between TP sizes. ``linear_fc1`` state is stored as
``[2, ffn, hidden]`` (gate, up) at every TP size: rank r's ``cat([gate_r, up_r])`` is then
``Shard(1)`` of it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

_SPLIT_ROWS = ("word_embeddings.weight", "output_layer.weight", "linear_qkv.weight", "linear_qkv.bias")
_SPLIT_COLUMNS = ("linear_proj.weight", "linear_fc2.weight")
_GLU = "linear_fc1.weight"
_LORA_SPLIT = (("linear_qkv", "lora_B", 0), ("linear_fc1", "lora_B", 0),
               ("linear_proj", "lora_A", 1), ("linear_fc2", "lora_A", 1))


def shard_dim(name: str) -> int | None:
    """The dimension ``name`` is split on across tensor-parallel ranks (None: replicated)."""
    if ".lora." in name:
        linear = name.split(".lora.")[0].rsplit(".", 1)[-1]
        return next((dim for owner, factor, dim in _LORA_SPLIT
                     if linear == owner and name.endswith(f".{factor}.weight")), None)
    if name.endswith(_SPLIT_ROWS) or name.endswith(_GLU):
        return 0
    if name.endswith(_SPLIT_COLUMNS):
        return 1
    return None


def split_for_rank(name: str, full: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
    """Rank ``rank``'s shard of the full tensor ``name``."""
    dim = shard_dim(name)
    if dim is None:
        return full
    if name.endswith(_GLU):
        gate, up = full.chunk(2, dim=0)
        return torch.cat([gate.chunk(tp, dim=0)[rank], up.chunk(tp, dim=0)[rank]])
    return full.chunk(tp, dim=dim)[rank].contiguous()


def join_shards(name: str, shards: list[torch.Tensor]) -> torch.Tensor:
    """Inverse of ``split_for_rank`` over all ranks' shards (in tensor-parallel rank order)."""
    dim = shard_dim(name)
    if dim is None:
        return shards[0]
    if name.endswith(_GLU):
        halves = [s.chunk(2, dim=0) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves])
    return torch.cat(shards, dim=dim)


def full_shape(name: str, local_shape: torch.Size, tp: int) -> torch.Size:
    dim = shard_dim(name)
    if dim is None:
        return local_shape
    shape = list(local_shape)
    shape[dim] *= tp
    return torch.Size(shape)


def gather_full(name: str, local: torch.Tensor, group) -> torch.Tensor:
    """The full tensor ``name`` from every rank's shard; a collective over ``group``."""
    if shard_dim(name) is None or dist.get_world_size(group) == 1:
        return local
    shards = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(shards, local.contiguous(), group=group)
    return join_shards(name, shards)


def optimizer_state_to_global(optim_state: dict, mesh) -> dict:
    """A flattened optimizer state dict (``get_optimizer_state_dict(...,
    flatten_optimizer_state_dict=True)``: keys ``state.<param fqn>.<entry>`` and
    ``param_groups.<param fqn>.<entry>``) with each sharded parameter's state tensors made global
    (DTensors over the 1-D tensor-parallel ``mesh``; plain tensors when ``mesh`` is None)."""
    from torch.distributed.tensor import DTensor, Shard

    def to_global(key: str, local):
        fqn = _state_param(key)
        dim = None if fqn is None else shard_dim(fqn)
        if dim is None or not isinstance(local, torch.Tensor) or local.ndim == 0:
            return local
        if fqn.endswith(_GLU):
            local, dim = local.unflatten(0, (2, -1)), 1
        return local if mesh is None else DTensor.from_local(local, mesh, [Shard(dim)], run_check=False)

    return {key: to_global(key, value) for key, value in optim_state.items()}


def optimizer_state_to_local(optim_state: dict) -> dict:
    """Inverse of ``optimizer_state_to_global`` (after DCP has loaded into it)."""
    from torch.distributed.tensor import DTensor

    def to_local(key: str, value):
        if isinstance(value, DTensor):
            value = value.to_local()
        fqn = _state_param(key)
        if fqn is not None and fqn.endswith(_GLU) and isinstance(value, torch.Tensor) and value.ndim == 3:
            value = value.flatten(0, 1)
        return value

    return {key: to_local(key, value) for key, value in optim_state.items()}


def _state_param(key: str) -> str | None:
    """``state.<param fqn>.<entry>`` -> the parameter's fqn (None for ``param_groups`` keys)."""
    return key.removeprefix("state.").rsplit(".", 1)[0] if key.startswith("state.") else None


class GatherVocabShards(torch.autograd.Function):
    """``[b, s, V/tp]`` vocab-parallel logits of each rank -> ``[b, s, V]`` on every rank.

    Backward keeps this rank's slice of the gradient without communication: everything after the
    gather (logprobs, loss) runs identically on every tensor-parallel rank, so the gradient of the
    full logits is already the same everywhere. (megatron-core's
    ``gather_from_tensor_model_parallel_region`` does the same but allocates its output with
    ``torch.cuda.current_device()``.)"""

    @staticmethod
    def forward(ctx, local: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        parts = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, local.contiguous(), group=group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        size, rank = dist.get_world_size(ctx.group), dist.get_rank(ctx.group)
        return grad.chunk(size, dim=-1)[rank].contiguous(), None


def check_fits(hf_config, tp: int) -> None:
    """Megatron splits heads, KV groups, the MLP and the vocabulary evenly: say which does not divide."""
    heads = hf_config.num_attention_heads
    sizes = {
        "num_attention_heads": heads,
        "num_key_value_heads": getattr(hf_config, "num_key_value_heads", None) or heads,
        "intermediate_size": hf_config.intermediate_size,
        "vocab_size": hf_config.vocab_size,
    }
    bad = [f"{key}={value}" for key, value in sizes.items() if value % tp]
    if bad:
        raise ValueError(f"tensor_parallel_size={tp} must divide {', '.join(bad)} of the model "
                         f"(the Megatron backend splits them evenly over the tensor-parallel ranks)")
