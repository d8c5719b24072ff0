"""Build one engine in this process (what each Ray replica runs too)."""

from __future__ import annotations

from rl_backends_gen.config import GenerationConfig
from rl_core.protocols import GenerationBackend


def build_local_backend(cfg: GenerationConfig, model_path: str) -> GenerationBackend:
    """One engine in this process, whatever ``cfg.num_replicas`` says."""
    if cfg.backend == "native":
        from rl_backends_gen.native import NativeEngine

        return NativeEngine(model_path, dtype=cfg.dtype, device=cfg.device, max_batch_size=cfg.max_batch_size,
                            max_seq_len=cfg.max_seq_len, seed=cfg.seed,
                            share_prompt_prefix=cfg.share_prompt_prefix, quantization=cfg.quantization,
                            fp8_scheme=cfg.fp8_scheme, speculative=cfg.speculative, record_routing=cfg.record_routing,
                            decode_graphs=cfg.decode_graphs, direct_decode=cfg.direct_decode)
    if cfg.backend == "hf":
        from rl_backends_gen.hf import HFGenerationBackend

        return HFGenerationBackend(model_path, cfg.dtype, cfg.device, batch_size=cfg.max_batch_size)
    if cfg.backend == "vllm":
        from rl_backends_gen.vllm_backend import VllmBackend

        return VllmBackend.from_config(cfg, model_path)
    if cfg.backend == "sglang":
        from rl_backends_gen.sglang_backend import SglangBackend

        return SglangBackend.from_config(cfg, model_path)
    if cfg.backend == "megatron":
        raise ValueError("generation.backend=megatron runs in the training workers, not as a separate engine or "
                         "replica: set generation.num_replicas=0 and build it with build_generation_backend(..., policy=)")
    raise ValueError(f"generation.backend={cfg.backend!r} is not one of native, vllm, sglang, hf, megatron")
