"""Multi-turn rollouts: generation + environments -> token-exact episodes (imports only rl_core)."""

from rl_algorithms.rollout.batch import episodes_to_batch, rollout_metrics
from rl_algorithms.rollout.chat_tokens import ChatTokens, TemplateNotAppendOnlyError
from rl_algorithms.rollout.config import EnvRunnerConfig
from rl_algorithms.rollout.engine import run_rollouts
from rl_algorithms.rollout.env_runner import EnvRunner, StepRunner, check_step_result, environment_map
from rl_algorithms.rollout.episode import Episode
from rl_algorithms.rollout.ray_env_runner import RayEnvRunner

__all__ = ["ChatTokens", "EnvRunner", "EnvRunnerConfig", "Episode", "RayEnvRunner", "StepRunner",
           "TemplateNotAppendOnlyError", "check_step_result", "environment_map", "episodes_to_batch",
           "rollout_metrics", "run_rollouts"]
