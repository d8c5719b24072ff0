"""Training backends: PyTorch DTensor (FSDP2 + tensor parallel) and Megatron-core, as Ray worker groups."""

from rl_backends_train.build import build_training_backend, check_training
from rl_backends_train.config import (
    DynamicBatchingConfig,
    LoRAConfig,
    OptimizerConfig,
    PackingConfig,
    PrecisionConfig,
    SchedulerConfig,
    TrainBackendConfig,
)

__version__ = "0.1.0"

__all__ = [
    "DynamicBatchingConfig",
    "LoRAConfig",
    "OptimizerConfig",
    "PackingConfig",
    "PrecisionConfig",
    "SchedulerConfig",
    "TrainBackendConfig",
    "build_training_backend",
    "check_training",
]
