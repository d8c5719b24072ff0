"""Multi-turn rollouts: generation + environments -> token-exact episodes (imports only rl_core)."""

from rl_algorithms.rollout.batch import episodes_to_batch, rollout_metrics
from rl_algorithms.rollout.chat_tokens import ChatTokens, TemplateNotAppendOnlyError
from rl_algorithms.rollout.engine import run_rollouts
from rl_algorithms.rollout.env_runner import EnvRunner, check_step_result
from rl_algorithms.rollout.episode import Episode

__all__ = ["ChatTokens", "EnvRunner", "Episode", "TemplateNotAppendOnlyError", "check_step_result",
           "episodes_to_batch", "rollout_metrics", "run_rollouts"]
