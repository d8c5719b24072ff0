"""`rl rm` end to end on a separable synthetic set: accuracy >= 0.9; the HF classifier it exports loads in
the reward-model environment."""

from __future__ import annotations

import json
from pathlib import Path

from rl_apps import recipe_path
from rl_apps.commands import rm
from rl_core.config import load_config


def run_recipe(module, recipe: str, out: Path, *overrides: str) -> list[dict]:
    """Load a packaged recipe with overrides, run it in-process, return its metrics.jsonl records."""
    cfg = load_config(module.CONFIG_CLASS, recipe_path(recipe), [f"output_dir={out}", *overrides])
    assert module.run(cfg) == 0
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_rm_recipe_separates_pairs_and_exports_a_classifier(tmp_path):
    out = tmp_path / "run"
    metrics = run_recipe(rm, "rm_tiny.yaml", out, "rm.max_steps=6", "rm.val_every=6")
    val = [m for m in metrics if "val/accuracy" in m]
    assert val[-1]["val/accuracy"] >= 0.9 and val[-1]["val/score_margin"] > val[0]["val/score_margin"]

    # The reward-model environment loads the export and ranks held-out style answers the same way.
    from rl_environments.reward_model import RewardModelEnvironment

    env = RewardModelEnvironment(str(out / "hf"))
    prompt = [{"role": "user", "content": "What is 2 + 3?"}]
    good, bad = env.score([prompt + [{"role": "assistant", "content": reply}]
                           for reply in ("The answer is 5.", "two three 9 wrong")])
    assert good > bad
