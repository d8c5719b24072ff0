"""Bradley-Terry reward models."""

from rl_algorithms.rm.config import RMConfig
from rl_algorithms.rm.loop import RewardModelBackend, rm_train, rm_validation

__all__ = ["RMConfig", "RewardModelBackend", "rm_train", "rm_validation"]
