"""`rl dpo` end to end on synthetic pairs with a clear signal: validation accuracy >= 0.9, HF checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rl_apps import recipe_path
from rl_apps.commands import dpo
from rl_core.config import ConfigError, load_config


def run_recipe(module, recipe: str, out: Path, *overrides: str) -> list[dict]:
    """Load a packaged recipe with overrides, run it in-process, return its metrics.jsonl records."""
    cfg = load_config(module.CONFIG_CLASS, recipe_path(recipe), [f"output_dir={out}", *overrides])
    assert module.run(cfg) == 0
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_dpo_recipe_reaches_validation_accuracy_and_converts(tmp_path):
    from rl_checkpoint import to_hf

    out = tmp_path / "run"
    metrics = run_recipe(dpo, "dpo_tiny.yaml", out, "dpo.max_steps=6", "dpo.val_every=6")
    val = [m for m in metrics if "val/accuracy" in m]
    assert val[0]["step"] == 0 and val[0]["val/accuracy"] == 0.0  # policy == reference: no margin yet
    assert val[-1]["val/accuracy"] >= 0.9
    assert val[-1]["val/reward_margin"] > 0 and val[-1]["val/loss"] < val[0]["val/loss"]
    to_hf(out / "checkpoints" / "step_000006" / "policy", tmp_path / "converted")
    assert list((tmp_path / "converted").glob("*.safetensors")) and (tmp_path / "converted" / "config.json").is_file()


def test_dpo_config_refuses_layouts_that_split_pairs():
    with pytest.raises(ConfigError, match="micro_batch_size must be even"):
        load_config(dpo.CONFIG_CLASS, recipe_path("dpo_tiny.yaml"), ["policy.micro_batch_size=3"])
    with pytest.raises(ConfigError, match="packing"):
        load_config(dpo.CONFIG_CLASS, recipe_path("dpo_tiny.yaml"), ["policy.packing.enabled=true"])


def test_dpo_with_lora_uses_the_base_weights_as_reference(tmp_path):
    """Under LoRA the reference is the model with its adapters off: accuracy starts at 0 (no margin)
    and the adapters alone separate the pairs."""
    out = tmp_path / "run"
    metrics = run_recipe(dpo, "dpo_tiny.yaml", out, "dpo.max_steps=4", "dpo.val_every=4",
                         "policy.lora={rank: 8, alpha: 16.0}", "policy.optimizer.lr=1e-2")
    val = [m for m in metrics if "val/accuracy" in m]
    assert val[0]["val/accuracy"] == 0.0 and val[0]["val/reward_margin"] == 0.0
    assert val[-1]["val/accuracy"] >= 0.9
    assert (out / "adapter" / "adapter_config.json").is_file()
