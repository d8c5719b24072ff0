"""`rl grpo` on images: the grpo_vlm_shapes_tiny recipe on a tiny Qwen2.5-VL (shapes prompts, one image each,
native engine): 3 steps with refit, generation logprobs equal the training forward's, resume gives the same
step 3; a text-only generation backend is refused before anything is written."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from rl_apps import recipe_path
from rl_apps.commands import grpo
from rl_core.config import ConfigError, load_config


def run(model: str, out: Path, *extra: str) -> None:
    cfg = load_config(grpo.CONFIG_CLASS, recipe_path("grpo_vlm_shapes_tiny.yaml"), [
        f"model={model}", f"output_dir={out}", "data.train_size=8", "data.validation_size=2", "grpo.batch_size=2",
        "grpo.val_every=3", "grpo.val_num_prompts=2", "checkpointing.every_n_steps=1", "logger.progress_bar=false",
        "logger.plot=false", *extra])
    assert grpo.run(cfg) == 0


@pytest.fixture(scope="module")
def tiny_vlm(tiny_vlm_dir) -> str:
    return tiny_vlm_dir("qwen2_5_vl")


def test_three_steps_with_refit_agree_on_logprobs_and_resume_exactly(tiny_vlm, tmp_path, step_metrics):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run(tiny_vlm, straight, "grpo.max_steps=3")
    steps = [step_metrics(straight, s) for s in (1, 2, 3)]
    for metrics in steps:  # every step trains; steps 2 and 3 generate with the refitted weights
        assert metrics["train/skipped"] == 0.0
        assert abs(metrics["train/token_mult_prob_error"] - 1.0) < 1e-4
    assert not math.isclose(steps[0]["train/reward_mean"], steps[2]["train/reward_mean"])
    assert "val/accuracy" in steps[2]
    run(tiny_vlm, resumed, "grpo.max_steps=2")
    run(tiny_vlm, resumed, "grpo.max_steps=3", "checkpointing.resume=true")
    assert step_metrics(resumed, 3) == steps[2]
    assert (straight / "hf" / "preprocessor_config.json").exists() or (straight / "hf" / "processor_config.json").exists()


def test_a_text_only_generation_backend_is_refused(tiny_vlm, tmp_path):
    with pytest.raises(ConfigError, match="'sglang' takes text prompts only"):
        run(tiny_vlm, tmp_path / "run", "generation.backend=sglang")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("recipe", "grader"), [("grpo_vlm_shapes_tiny", "reward_function"), ("grpo_vlm_shapes", "shapes")])
def test_dry_run_shows_the_prompt_with_its_image_tokens(tiny_vlm, tmp_path, capsys, recipe, grader):
    from rl_apps.cli import main

    code = main(["grpo", "--config", recipe, f"model={tiny_vlm}", f"output_dir={tmp_path / 'run'}", "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"graded by env.name='{grader}'" in out
    assert "sample    training prompt 1: " in out and "(4 image tokens, ⟨ ⟩)" in out
    assert "<|vision_start|>⟨image 32x32 px: 4 tokens⟩<|vision_end|>What colour is the largest shape?" in out
    assert not (tmp_path / "run").exists()
