"""Which experts of each mixture-of-experts layer an expert-parallel rank holds, and their names.

With ``expert_parallel_size`` EP and E experts per layer, expert-parallel rank r builds experts
``r * E/EP .. (r+1) * E/EP - 1`` (megatron-core's even split) as ``local_experts.0 .. E/EP - 1``.
The **global** names number them as in a one-rank model (``local_experts.{j + r * E/EP}``), so HF
names, checkpoints and optimizer-state keys do not depend on EP (as ``stages.PipelineStage`` does
for layers). The expert-parallel ranks are data-parallel ranks (Megatron carves the expert group
out of the data-parallel one): each runs its own rows, and every MoE layer exchanges tokens with the
others (all-to-all) to reach their experts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_EXPERT = re.compile(r"^(.*\.mlp\.experts\.local_experts\.)(\d+)(\..+)$")


def is_expert(name: str) -> bool:
    """A tensor of one expert (its parameters are not replicated over the expert-parallel ranks)."""
    return _EXPERT.match(name) is not None


@dataclass(frozen=True)
class ExpertShard:
    rank: int
    size: int
    num_experts: int
    """Experts per MoE layer in the whole model (0: a dense model)."""

    @property
    def per_rank(self) -> int:
        return self.num_experts // self.size

    def to_global(self, name: str) -> str:
        m = _EXPERT.match(name)
        if m is None or self.size == 1:
            return name
        return f"{m[1]}{int(m[2]) + self.rank * self.per_rank}{m[3]}"

    def to_local(self, name: str) -> str | None:
        """Inverse of ``to_global``; None for another rank's expert."""
        m = _EXPERT.match(name)
        if m is None or self.size == 1:
            return name
        local = int(m[2]) - self.rank * self.per_rank
        return f"{m[1]}{local}{m[3]}" if 0 <= local < self.per_rank else None

    def all_global(self, name: str) -> list[str]:
        """The global names of every expert for this rank's expert tensor ``name`` (global)."""
        m = _EXPERT.match(name)
        if m is None or self.size == 1:
            return [name]
        return [f"{m[1]}{j}{m[3]}" for j in range(self.num_experts)]


def num_experts(hf_config) -> int:
    """Experts per MoE layer of an HF config (0 for dense models): Mixtral's ``num_local_experts``,
    Qwen3-MoE's ``num_experts``."""
    return int(getattr(hf_config, "num_local_experts", 0) or getattr(hf_config, "num_experts", 0) or 0)


def check_fits(hf_config, expert_parallel_size: int) -> None:
    experts = num_experts(hf_config)
    if expert_parallel_size > 1 and not experts:
        raise ValueError(f"expert_parallel_size={expert_parallel_size} needs a mixture-of-experts model "
                         f"(Mixtral, Qwen3-MoE); {hf_config.model_type} has no experts: set expert_parallel_size=1")
    if experts % expert_parallel_size:
        raise ValueError(f"expert_parallel_size={expert_parallel_size} must divide the model's {experts} experts "
                         "per layer (each rank holds the same number)")


def patch_router_without_transformer_engine() -> None:
    """megatron-core 0.16.1's router linear (``moe_utils.RouterGatingLinearFunction``) tests
    ``te_general_gemm is not None``, a name its module defines only when Transformer Engine imports:
    without TE (CPU, or this backend's local layer spec on GPU) every MoE forward raises NameError.
    Defining it as None selects the function's own torch.mm path, as megatron-core intends."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
