"""``rl eval``: pass@k / cons@k / mean@k of a model or checkpoint on one or more datasets.

The same code as the ``rl-eval`` command and GRPO's validation (``rl_eval.evaluate``):

    rl eval                                          # SmolLM2-135M-Instruct on 200 arithmetic problems
    rl eval model=runs/grpo sampling.n=8 k_values=[1,4,8]  # a run (its latest checkpoint), a step dir, its policy/
    rl eval model=runs/grpo/checkpoints/step_000005
    rl eval --config eval_tiny                       # the offline tiny model, in seconds
"""

from __future__ import annotations

from rl_apps import recipe_path
from rl_eval.cli import run_cli
from rl_eval.config import EvalConfig

CONFIG_CLASS = EvalConfig
DEFAULT_RECIPE = recipe_path("eval_arithmetic.yaml")


def run(cfg: EvalConfig) -> int:
    """Print one summary line per dataset and metric, write ``cfg.report_path``; 2 on bad input."""
    return run_cli(cfg)
