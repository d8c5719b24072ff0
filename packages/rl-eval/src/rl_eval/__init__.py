"""pass@k / cons@k evaluation of any checkpoint on any dataset.

``evaluate(generation, tokenizer, dataset, grader, sampling, k_values)`` evaluates a generation backend;
its metrics come from ``evaluate_rollouts(rollout, dataset, sampling, k_values)``, which GRPO's
validation calls with its own (multi-turn) rollouts: ``rl eval``, ``rl-eval`` and validation share them.
"""

__version__ = "0.1.0"

from rl_eval.config import EvalConfig, EvalDatasetConfig, EvalSamplingConfig, GraderConfig
from rl_eval.errors import EvalError
from rl_eval.metrics import cons_at_k, majority_vote, mean_at_k, pass_at_k
from rl_eval.runner import EvalReport, ItemResult, Rollout, SampleResult, evaluate, evaluate_rollouts, graded_sample

__all__ = ["EvalConfig", "EvalDatasetConfig", "EvalError", "EvalReport", "EvalSamplingConfig", "GraderConfig",
           "ItemResult", "Rollout", "SampleResult", "cons_at_k", "evaluate", "evaluate_rollouts", "graded_sample",
           "majority_vote", "mean_at_k", "pass_at_k"]


def run_eval(cfg: EvalConfig, **kwargs):
    """Config-driven evaluation (see rl_eval.run.run_eval)."""
    from rl_eval.run import run_eval as _run_eval

    return _run_eval(cfg, **kwargs)
