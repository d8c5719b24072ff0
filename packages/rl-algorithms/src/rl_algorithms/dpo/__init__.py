"""Direct preference optimisation."""

from rl_algorithms.dpo.config import DPOConfig
from rl_algorithms.dpo.loop import dpo_train, dpo_validation

__all__ = ["DPOConfig", "dpo_train", "dpo_validation"]
