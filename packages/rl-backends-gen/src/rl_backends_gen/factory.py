"""Build the configured generation backend: in-process or as a group of Ray replicas.

Import graph (no cycle): ``factory -> local, ray_group``; ``ray_group -> local``.
"""

from __future__ import annotations

from rl_backends_gen.config import GenerationConfig
from rl_backends_gen.local import build_local_backend
from rl_core.config import ConfigError, ConfigProblem
from rl_core.protocols import GenerationBackend

__all__ = ["build_generation_backend", "build_local_backend"]


def build_generation_backend(cfg: GenerationConfig, model_path: str, policy=None) -> GenerationBackend:
    """The backend ``cfg`` asks for: in-process when ``num_replicas == 0``, else a Ray replica group;
    ``megatron``: the training ``policy``'s own workers decode (its ``generation_backend(cfg)``)."""
    if cfg.backend == "megatron":
        if not hasattr(policy, "generation_backend"):
            raise ConfigError(ConfigProblem(where="config", key="generation.backend", message=(
                "megatron decodes on the Megatron training workers: it needs policy.backend=megatron and a command "
                "that passes its policy (rl grpo); use native here")))
        return policy.generation_backend(cfg)
    if cfg.num_replicas == 0:
        return build_local_backend(cfg, model_path)
    from rl_backends_gen.ray_group import RayGenerationGroup

    return RayGenerationGroup(cfg, model_path)
