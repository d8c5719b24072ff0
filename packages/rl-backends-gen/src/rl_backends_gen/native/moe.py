"""The engine's mixture-of-experts dispatch: token-expert pairs sorted by expert, one matmul pair per
expert over a contiguous slice.

transformers' experts modules (those under ``@use_experts_implementation``: Qwen3-MoE, Qwen3.5-MoE,
GLM-4.7-Flash, GPT-OSS, Nemotron-H) take the flat tokens ``[N, hidden]``, each token's ``k`` experts
``[N, k]`` and routing weights ``[N, k]``. Their eager forward builds a one-hot mask of
``[experts + 1, k, N]`` and runs ``nonzero`` / ``where`` per expert; their ``grouped_mm`` forward runs
over every expert's weights whatever the batch. Here the ``N * k`` pairs are sorted by expert once
(``argsort`` + ``bincount``, one host read of the counts), each expert hit runs its two matmuls on its
contiguous slice of the sorted pairs, and the weighted results are scattered back and summed over
``k``: the same products and sums as the reference, in another order (fp32 results agree to ~1e-7).

The expert weights of a ``[E, out, in]`` layout (all but GPT-OSS's) are re-laid in memory as
``[E, in, out]`` with the same shape and values (a transposed view of a contiguous copy): CPU GEMM
reads a few-row input times a weight stored that way ~1.3x faster. Refit copies into the parameters
in place (``copy_weights_in_place``), which keeps that layout. The gate (the model's own
``_apply_gate`` for gated experts, else its activation) and the biases are the module's.

CPU only (``layers.build_layer_caches`` installs it there): it reads the per-expert counts on the host
and launches one matmul pair per expert, where on CUDA transformers' default ``grouped_mm`` runs all
experts in one kernel without a host sync.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn


def install(model: nn.Module) -> int:
    """Give every experts module of ``model`` the engine's forward; returns how many were found."""
    count = 0
    for module in model.modules():
        if not _is_experts(module):
            continue
        if not module.is_transposed:  # [E, out, in] -> same shape, [E, in, out] in memory
            for name in ("gate_up_proj" if module.has_gate else "up_proj", "down_proj"):
                weight = getattr(module, name)
                weight.data = weight.data.transpose(1, 2).contiguous().transpose(1, 2)
        module.forward = types.MethodType(experts_forward, module)
        count += 1
    return count


def _is_experts(module: nn.Module) -> bool:
    """A transformers experts module of 3-D stacked weights (the ``use_experts_implementation`` layout)."""
    up = "gate_up_proj" if getattr(module, "has_gate", None) else "up_proj"
    return all(hasattr(module, flag) for flag in ("has_gate", "has_bias", "is_transposed", "num_experts")) and \
        all(isinstance(getattr(module, name, None), nn.Parameter) and getattr(module, name).dim() == 3
            for name in (up, "down_proj"))


def experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor) -> torch.Tensor:
    """``hidden_states`` [N, hidden], ``top_k_index`` / ``top_k_weights`` [N, k] -> [N, hidden]."""
    tokens, k = top_k_index.shape
    experts = top_k_index.reshape(-1)  # [N * k]: pair p is token p // k
    order = torch.argsort(experts, stable=True)  # pairs grouped by expert
    counts = torch.bincount(experts, minlength=self.num_experts)[: self.num_experts].tolist()
    inputs = hidden_states[order // k]  # [N * k, hidden], sorted
    up, down = (self.gate_up_proj, self.down_proj) if self.has_gate else (self.up_proj, self.down_proj)
    up_bias = (self.gate_up_proj_bias if self.has_gate else self.up_proj_bias) if self.has_bias else None
    outputs = hidden_states.new_empty(inputs.shape[0], down.shape[2] if self.is_transposed else down.shape[1])
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        rows = slice(start, start + count)
        start += count
        projected = _linear(self, inputs[rows], up[expert], None if up_bias is None else up_bias[expert])
        projected = self._apply_gate(projected) if self.has_gate else self.act_fn(projected)
        bias = self.down_proj_bias[expert] if self.has_bias else None
        outputs[rows] = _linear(self, projected, down[expert], bias)
    weighted = outputs * top_k_weights.reshape(-1)[order, None].to(outputs.dtype)
    unsorted = torch.empty_like(weighted)
    unsorted[order] = weighted  # back to (token, slot) order
    return unsorted.view(tokens, k, -1).sum(dim=1).to(hidden_states.dtype)


def _linear(self, inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``inputs @ weight`` for an ``[in, out]`` weight (transposed layout), else ``F.linear``; plus ``bias``."""
    out = inputs @ weight if self.is_transposed else F.linear(inputs, weight)
    return out if bias is None else out + bias
