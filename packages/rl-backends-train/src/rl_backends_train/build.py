"""Pick and build the training backend the config names."""

from __future__ import annotations

from rl_backends_train.config import TrainBackendConfig


def build_training_backend(cfg: TrainBackendConfig, model_path: str, *, seed: int = 0, name: str = "policy"):
    """A TrainingBackend (rl_core.protocols) for the HF model directory ``model_path``."""
    if cfg.backend == "megatron":
        from rl_backends_train.megatron import MegatronPolicy  # raises a clear error without the extra

        return MegatronPolicy(cfg, model_path, seed=seed, name=name)
    from rl_backends_train.dtensor import DTensorPolicy

    return DTensorPolicy(cfg, model_path, seed=seed, name=name)
