"""Generation backends: the native torch engine, vLLM, SGLang and an HF reference.

Heavy engines are imported lazily: ``rl_backends_gen.vllm_backend`` / ``sglang_backend`` raise one
clear error naming the pip extra when their package is missing.
"""

from rl_backends_gen.config import GenerationConfig, SglangConfig, VllmConfig
from rl_backends_gen.factory import build_generation_backend, build_local_backend
from rl_backends_gen.model_checks import check_generation

__version__ = "0.1.0"

__all__ = ["GenerationConfig", "SglangConfig", "VllmConfig", "build_generation_backend", "build_local_backend",
           "check_generation"]
