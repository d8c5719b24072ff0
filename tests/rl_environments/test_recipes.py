"""The environment recipes of `rl grpo` run end to end on the tiny model (one step each)."""

from __future__ import annotations

import os

import pytest

RECIPES = ["grpo_math_tiny.yaml", "grpo_sliding_puzzle_tiny.yaml", "grpo_tools_tiny.yaml"]


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_runs_one_step(recipe, tmp_path, tmp_path_factory):
    pytest.importorskip("rl_apps.commands.grpo")
    from rl_apps import recipe_path
    from rl_apps.cli import main
    from rl_core.logging import read_jsonl_metrics

    os.environ.setdefault("RL_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "rl-cache"))
    out = tmp_path / "run"
    assert main(["grpo", "--config", recipe_path(recipe), f"output_dir={out}", "grpo.max_steps=1",
                 "checkpointing.enabled=false",
                 # train even without signal: the loss reports the generation/training logprob agreement
                 "grpo.skip_steps_without_signal=false"]) == 0
    step = next(r for r in read_jsonl_metrics(out / "metrics.jsonl") if r.get("step") == 1 and "train/episodes" in r)
    assert step["train/episodes"] == 8.0 and step["train/env_errors"] == 0.0
    if recipe == "grpo_sliding_puzzle_tiny.yaml":  # the random model never solves it: every turn is used
        assert step["train/num_turns_mean"] == 3.0 and step["train/env/invalid_moves"] >= 1.0
    if recipe == "grpo_math_tiny.yaml":
        assert {"train/reward/correct", "train/reward/format", "train/reward/integer"} <= set(step)
    # generation and training logprobs agree across all turns, observations included in the context
    assert abs(step["train/token_mult_prob_error"] - 1.0) < 1e-4
