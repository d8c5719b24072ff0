"""Pick and build the training backend the config names; check, before that, what it would refuse."""

from __future__ import annotations

from rl_backends_train.config import TrainBackendConfig
from rl_core.config import ConfigError, ConfigProblem


def build_training_backend(cfg: TrainBackendConfig, model_path: str, *, seed: int = 0, name: str = "policy"):
    """A TrainingBackend (rl_core.protocols) for the HF model directory ``model_path``."""
    if cfg.backend == "megatron":
        from rl_backends_train.megatron import MegatronPolicy  # raises a clear error without the extra

        return MegatronPolicy(cfg, model_path, seed=seed, name=name)
    from rl_backends_train.dtensor import DTensorPolicy

    return DTensorPolicy(cfg, model_path, seed=seed, name=name)


def check_training(cfg: TrainBackendConfig, model_path: str, section: str = "policy") -> None:
    """ConfigError at ``section`` for what the backend would refuse to train on the model at ``model_path``,
    from the configs alone (no weights read, no worker started): what a vision-language model allows
    (``vision.check_vision_support``), the backend's own driver check (``DTensorPolicy.check``: FP8 on this
    device; ``MegatronPolicy.check``: the family, the stages and experts over the ranks), and for DTensor the
    family's layout (packing over recurrent layers, sequence-parallel plans) and, with tensor parallel, a
    plan for its layers. The backend refuses the same once built; found here, before a run writes
    anything, a mistake is one line and exit 2. Megatron's checks need its extra; without it this skips
    them (building the backend then names the extra)."""
    from transformers import AutoConfig

    from rl_backends_train.families import check_training_layout, tensor_parallel_layer_plan
    from rl_backends_train.vision import check_vision_support

    try:
        check_vision_support(cfg, model_path)
        if cfg.backend == "megatron":
            try:
                from rl_backends_train.megatron import MegatronPolicy
            except ImportError:
                return
            MegatronPolicy.check(cfg, model_path)
            return
        from rl_backends_train.dtensor import DTensorPolicy

        DTensorPolicy.check(cfg, model_path)
        config = AutoConfig.from_pretrained(model_path)
        check_training_layout(config, cfg)
        if cfg.tensor_parallel_size > 1:
            tensor_parallel_layer_plan(config)
    except ConfigError:
        raise
    except (ValueError, NotImplementedError) as e:
        raise ConfigError(ConfigProblem("config", section, str(e))) from None
