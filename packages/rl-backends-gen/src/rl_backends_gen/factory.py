"""Build the configured generation backend: in-process or as a group of Ray replicas.

Import graph (no cycle): ``factory -> local, ray_group``; ``ray_group -> local``.
"""

from __future__ import annotations

from rl_backends_gen.config import GenerationConfig
from rl_backends_gen.local import build_local_backend
from rl_core.protocols import GenerationBackend

__all__ = ["build_generation_backend", "build_local_backend"]


def build_generation_backend(cfg: GenerationConfig, model_path: str) -> GenerationBackend:
    """The backend ``cfg`` asks for: in-process when ``num_replicas == 0``, else a Ray replica group."""
    if cfg.num_replicas == 0:
        return build_local_backend(cfg, model_path)
    from rl_backends_gen.ray_group import RayGenerationGroup

    return RayGenerationGroup(cfg, model_path)
