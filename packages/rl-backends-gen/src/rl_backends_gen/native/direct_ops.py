"""Operations the engine's direct decode layers share (``direct.py``, ``direct_qwen3_5.py``): weights packed
into one product, the families' RMSNorms and rotary embedding, written as transformers' forwards compute
them (the same operations in the same order: bitwise equal on CPU)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# Mixture-of-experts blocks a direct layer calls as the modules they are (router, experts; on CPU the engine's
# expert dispatch, moe.py).
EXPERT_BLOCKS = {"Qwen3MoeSparseMoeBlock", "MixtralSparseMoeBlock", "Qwen3_5MoeSparseMoeBlock"}


class DirectMLP:
    """A decoder layer's MLP: a gated MLP with its gate and up weights packed into one product, or an
    expert block called as its module."""

    def __init__(self, mlp: nn.Module):
        self.mlp = mlp
        self.gated = type(mlp).__name__ not in EXPERT_BLOCKS
        if self.gated:
            self.gate_up_weight, self.gate_up_bias = pack_rows([mlp.gate_proj, mlp.up_proj])
            self.intermediate = mlp.gate_proj.out_features

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        mlp = self.mlp
        if not self.gated:
            return mlp(hidden)
        gate, up = F.linear(hidden, self.gate_up_weight, self.gate_up_bias).split(self.intermediate, dim=-1)
        return mlp.down_proj(mlp.act_fn(gate) * up)

    @staticmethod
    def linears(mlp: nn.Module) -> list:
        """The linears a packed MLP needs to be plain (none for an expert block)."""
        if type(mlp).__name__ in EXPERT_BLOCKS:
            return []
        return [getattr(mlp, name, None) for name in ("gate_proj", "up_proj", "down_proj")]


def pack_rows(linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One ``[sum(out), in]`` weight (and bias) holding the linears' rows; each linear's parameters become
    row slices of it."""
    packs = []
    for name in ("weight", "bias"):
        parts = [getattr(linear, name) for linear in linears]
        if any(part is None for part in parts):
            packs.append(None)
            continue
        pack = torch.cat([part.detach() for part in parts])
        start = 0
        for linear, part in zip(linears, parts):
            rows = part.shape[0]
            setattr(linear, name, nn.Parameter(pack[start:start + rows], requires_grad=False))
            start += rows
        packs.append(pack)
    return packs[0], packs[1]


def rms_norm(hidden: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """transformers' RMSNorm forward (Llama's): float32 statistics, the scale in the input dtype."""
    dtype = hidden.dtype
    hidden = hidden.to(torch.float32)
    variance = hidden.pow(2).mean(-1, keepdim=True)
    hidden = hidden * torch.rsqrt(variance + norm.variance_epsilon)
    return norm.weight * hidden.to(dtype)


def zero_centered_rms_norm(hidden: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """Qwen3.5's RMSNorm: the weight is an offset from 1, applied in float32 before the cast back."""
    out = hidden.float()
    out = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + norm.eps)
    return (out * (1.0 + norm.weight.float())).type_as(hidden)


def rotate(heads: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' ``apply_rotary_pos_emb`` for ``[R, q, heads, D]``: ``x cos + rotate_half(x) sin``; a
    partial rotary embedding (``cos`` narrower than ``D``) rotates the first dims and keeps the rest."""
    dims = cos.shape[-1]
    if dims < heads.shape[-1]:
        return torch.cat([rotate(heads[..., :dims], cos, sin), heads[..., dims:]], dim=-1)
    half = dims // 2
    return heads * cos + torch.cat((-heads[..., half:], heads[..., :half]), dim=-1) * sin


def plain(linears: list) -> bool:
    """Every module is a plain ``nn.Linear`` (not FP8, not LoRA-wrapped, not missing)."""
    return all(type(linear) is nn.Linear for linear in linears)
