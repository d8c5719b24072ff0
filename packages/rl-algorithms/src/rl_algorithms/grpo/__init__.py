"""GRPO and its variants (DAPO, GSPO, GDPO as config presets)."""

from rl_algorithms.grpo.config import AdvantageConfig, DAPOConfig, GRPOConfig, ImportanceSamplingConfig, LossConfig
from rl_algorithms.grpo.data import PromptStream, prompt_length_check
from rl_algorithms.grpo.loop import grpo_step, grpo_train, train_on_batch
from rl_algorithms.grpo.rewards import compute_rewards_and_advantages, episode_metrics
from rl_algorithms.grpo.rollouts import generate_rollouts

__all__ = [
    "AdvantageConfig",
    "DAPOConfig",
    "GRPOConfig",
    "ImportanceSamplingConfig",
    "LossConfig",
    "PromptStream",
    "compute_rewards_and_advantages",
    "episode_metrics",
    "generate_rollouts",
    "grpo_step",
    "grpo_train",
    "prompt_length_check",
    "train_on_batch",
]
