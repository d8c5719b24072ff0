"""FP8 linear layers for inference, and the one rule of which linears run in FP8.

``quantize_linear_weights_(model, scheme)`` swaps each eligible ``nn.Linear`` of a model for an
``Fp8Linear`` holding its weight in e4m3 with per-channel or 128 x 128 block scales (activations are
quantized on the fly, see ``numerics.fp8_linear``). A generation engine calls ``load_weight`` on
each with the new high-precision weight at refit: it re-quantizes in place, so the buffers keep
their storage (CUDA graphs captured on them stay valid).

``is_fp8_eligible`` is shared with FP8 training (``rl_backends_train.fp8``): the LM head, reward
head, MoE routers and linears whose in/out features are not multiples of 16 (``torch._scaled_mm``'s
constraint) stay in high precision; embeddings and norms are not linears and never convert.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from rl_core.fp8.numerics import Fp8Tensor, WeightScheme, block_shape, fp8_linear, quantize_weight

DEFAULT_SKIP_MODULES: tuple[str, ...] = ("lm_head", "score", "mlp.gate", "router", "shared_expert_gate")
"""Module paths (or their last components) kept in high precision: LM head, reward head, MoE routers."""

FEATURE_MULTIPLE = 16
"""In and out features of an FP8 linear must be multiples of this (``torch._scaled_mm``)."""


def matches_module(fqn: str, patterns: Sequence[str]) -> bool:
    """Whether the module path ``fqn`` is one of ``patterns`` or ends with ``.<pattern>``."""
    return any(fqn == p or fqn.endswith("." + p) for p in patterns)


def is_fp8_eligible(fqn: str, module: nn.Module, skip_modules: Sequence[str] = DEFAULT_SKIP_MODULES) -> bool:
    """A plain ``nn.Linear`` (not a subclass such as a LoRA layer, whose forward is its own), not in
    ``skip_modules``, with in and out features multiples of 16."""
    return (type(module) is nn.Linear and not matches_module(fqn, skip_modules)
            and module.in_features % FEATURE_MULTIPLE == 0 and module.out_features % FEATURE_MULTIPLE == 0)


class Fp8Linear(nn.Module):
    """``y = x @ W.T + b`` with ``W`` held in float8_e4m3fn: buffers ``weight`` [out, in] (e4m3) and
    ``weight_scale`` (fp32, one per output channel ``[out, 1]`` or per 128 x 128 block), ``bias`` in
    high precision. Inference only (no gradient reaches ``weight``)."""

    def __init__(self, weight: Fp8Tensor, bias: torch.Tensor | None, scheme: WeightScheme) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.scheme = scheme
        self.register_buffer("weight", weight.data)
        self.register_buffer("weight_scale", weight.scale)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear, scheme: WeightScheme) -> Fp8Linear:
        return cls(quantize_weight(linear.weight.detach(), scheme), linear.bias, scheme)

    @property
    def fp8_weight(self) -> Fp8Tensor:
        return Fp8Tensor(self.weight, self.weight_scale, block_shape(self.scheme, self.in_features))

    @torch.no_grad()
    def load_weight(self, weight: torch.Tensor) -> None:
        """Quantize a new high-precision ``weight`` [out, in] into this layer's buffers, in place (refit)."""
        if tuple(weight.shape) != (self.out_features, self.in_features):
            raise ValueError(f"Fp8Linear.load_weight: expected shape {(self.out_features, self.in_features)}, "
                             f"got {tuple(weight.shape)}")
        q = quantize_weight(weight.to(self.weight.device), self.scheme)
        self.weight.copy_(q.data)
        self.weight_scale.copy_(q.scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fp8_linear(x, self.fp8_weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, scheme={self.scheme}"


@torch.no_grad()
def quantize_linear_weights_(model: nn.Module, scheme: WeightScheme = "per_channel",
                             skip_modules: Sequence[str] = DEFAULT_SKIP_MODULES) -> list[str]:
    """Replace every FP8-eligible ``nn.Linear`` of ``model`` (``is_fp8_eligible``) by an ``Fp8Linear``
    with ``scheme`` scales, in place; returns the converted module paths."""
    targets = [(fqn, m) for fqn, m in model.named_modules() if is_fp8_eligible(fqn, m, skip_modules)]
    for fqn, linear in targets:
        parent_name, _, child = fqn.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, Fp8Linear.from_linear(linear, scheme))
    return [fqn for fqn, _ in targets]


def fp8_layers_by_weight_name(model: nn.Module) -> dict[str, Fp8Linear]:
    """``{"<module path>.weight": layer}`` for every ``Fp8Linear`` of ``model``: where a refit routes a
    high-precision weight of that name (``layer.load_weight(tensor)``) instead of copying it into the
    e4m3 buffer, which would drop the scale."""
    return {f"{fqn}.weight": m for fqn, m in model.named_modules() if isinstance(m, Fp8Linear)}
