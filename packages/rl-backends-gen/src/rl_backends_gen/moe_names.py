"""Mixture-of-experts weights for a vLLM refit: the trainer's stacked expert tensors -> the per-expert
checkpoint names and layouts vLLM's model loader takes.

transformers 5 (5.19: ``Qwen3MoeExperts``, ``MixtralExperts``) holds each MoE layer's experts stacked, and
that is what every trainer here sends (HF ``named_parameters``; Megatron's mapping writes the same):

    model.layers.{i}.mlp.experts.gate_up_proj  [E, 2 * I, H]  expert e: gate rows [:I], then up rows [I:]
    model.layers.{i}.mlp.experts.down_proj     [E, H, I]
    model.layers.{i}.mlp.gate.weight           [E, H]           the router

``save_pretrained`` writes them per expert, the layout of the family's checkpoints, which is what vLLM's
loader reads (vllm 0.32 ``models/qwen3_moe.py`` / ``models/mixtral.py``: ``FusedMoE`` with ``ckpt_names``
gate_proj/down_proj/up_proj resp. w1/w2/w3). Stacked names are refused by mixtral's loader, whose modules
live under ``block_sparse_moe``; qwen3_moe's loader in vLLM 0.32 also takes them as a "fused" checkpoint
tensor, but the per-expert names are the checkpoint layout every vLLM version reads, so both are sent so:

    qwen3_moe  model.layers.{i}.mlp.experts.{e}.gate_proj.weight [I, H], up_proj [I, H], down_proj [H, I];
               router model.layers.{i}.mlp.gate.weight
    mixtral    model.layers.{i}.block_sparse_moe.experts.{e}.w1.weight (gate), w3 (up), w2 (down);
               router model.layers.{i}.block_sparse_moe.gate.weight

Each per-expert tensor is a Linear weight ``[out, in]`` sliced from the stacked one, no transpose; the
slices are views, so a bucket carries the stacked bytes once. Other names pass unchanged. The families
listed in ``CHECKPOINT_EXPERT_NAMES`` are the ones whose refit into vLLM is tested
(tests/rl_backends_gen/test_families_vllm.py); ``rl_backends_gen.vllm_args.moe_refit_refusal`` refuses
other MoE families.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from rl_backends_gen.weights import chunk_named_tensors


@dataclass(frozen=True)
class CheckpointExpertNames:
    """How a family's checkpoint names a MoE layer: the block's module and each expert's three Linears."""

    block: str  # "mlp" or "block_sparse_moe"
    gate: str
    up: str
    down: str


CHECKPOINT_EXPERT_NAMES: dict[str, CheckpointExpertNames] = {
    "qwen3_moe": CheckpointExpertNames(block="mlp", gate="gate_proj", up="up_proj", down="down_proj"),
    "mixtral": CheckpointExpertNames(block="block_sparse_moe", gate="w1", up="w3", down="w2"),
}
"""HF ``model_type`` -> its per-expert checkpoint names (what vLLM's loader for the family reads)."""

_STACKED = re.compile(r"^(?P<layer>.*\.)mlp\.experts\.(?P<part>gate_up_proj|down_proj)$")
_ROUTER = re.compile(r"^(?P<layer>.*\.)mlp\.gate\.weight$")


def to_checkpoint_names(names: CheckpointExpertNames,
                        named_tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` pairs of the trainer's layout -> the checkpoint's: each stacked expert tensor
    becomes E (down_proj) or 2 * E (gate_up_proj) per-expert views; the router is renamed into the
    family's block; every other pair passes unchanged."""
    for name, tensor in named_tensors:
        stacked = _STACKED.match(name)
        router = _ROUTER.match(name)
        if stacked is not None:
            prefix = f"{stacked['layer']}{names.block}.experts"
            if stacked["part"] == "down_proj":  # [E, H, I]
                for e, down in enumerate(tensor.unbind(0)):
                    yield f"{prefix}.{e}.{names.down}.weight", down
            else:  # [E, 2 * I, H]: gate rows first
                gates, ups = tensor.chunk(2, dim=1)
                for e, (gate, up) in enumerate(zip(gates.unbind(0), ups.unbind(0), strict=True)):
                    yield f"{prefix}.{e}.{names.gate}.weight", gate
                    yield f"{prefix}.{e}.{names.up}.weight", up
        elif router is not None:
            yield f"{router['layer']}{names.block}.gate.weight", tensor
        else:
            yield name, tensor


def refit_buckets(named_tensors: Iterable[tuple[str, torch.Tensor]], max_bytes: int, *, dtype: str | None,
                  names: CheckpointExpertNames | None) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """The buckets of a refit (``weights.chunk_named_tensors``: at most ``max_bytes`` each, cast to ``dtype``),
    each translated to the checkpoint's names when ``names`` is given: a stacked expert tensor is
    counted and bucketed as one, so its per-expert pieces travel in the same bucket."""
    for chunk in chunk_named_tensors(named_tensors, max_bytes, dtype=dtype):
        yield chunk if names is None else list(to_checkpoint_names(names, chunk))
