"""Mixture-of-experts routers of HF models: the modules that choose each token's experts.

Shared by the generation engine, which records the chosen experts (``rl_backends_gen.native.routing``),
and the trainer, which replays them (``rl_backends_train.router_replay``): MoE router replay.

In every MoE family the project runs (transformers 5.19), each MoE layer routes through one module
whose forward takes hidden states ``[..., hidden]`` and returns ``(router_logits [N, E], weights [N, k],
indices [N, k])`` for the ``N`` tokens in row-major order of the leading dims. ``moe_routers`` lists a
model's routers in decoder-layer order, which is the order of the ``moe_layers`` axis of a routing
record (``[positions, moe_layers, k]``, dtype ``ROUTING_DTYPE``; ``NOT_RECORDED`` where no expert was
recorded).
"""

from __future__ import annotations

import torch
from torch import nn

# Router class -> how its weights follow from its logits (rl_backends_train.router_replay re-computes
# them for replayed experts): "softmax" (softmax over all experts, then top-k), "sigmoid" (DeepSeek-V3
# style: sigmoid scores, a bias only for choosing), "softmax_of_topk" (top-k logits, then softmax).
ROUTER_KINDS: dict[str, str] = {
    "MixtralTopKRouter": "softmax",
    "Qwen3MoeTopKRouter": "softmax",
    "Qwen3_5MoeTopKRouter": "softmax",
    "Glm4MoeLiteTopkRouter": "sigmoid",
    "NemotronHTopkRouter": "sigmoid",
    "GptOssTopKRouter": "softmax_of_topk",
}
ROUTING_DTYPE = torch.int16  # expert ids (models have at most a few hundred experts)
NOT_RECORDED = -1


def moe_routers(model: nn.Module) -> list[nn.Module]:
    """The MoE routers of ``model`` in decoder-layer order (empty for a dense model)."""
    return [module for module in model.modules() if type(module).__name__ in ROUTER_KINDS]


def experts_per_token(routers: list[nn.Module]) -> int:
    """``k``, the experts each token goes to (the same in every MoE layer of a model)."""
    ks = {router.top_k for router in routers}
    if len(ks) != 1:
        raise ValueError(f"MoE routers choose different numbers of experts per token: {sorted(ks)}")
    return ks.pop()
