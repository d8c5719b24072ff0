"""Every RL preset of the comparison (docs/learning.md): the main job's task settings, one step on a tiny
model, Dr. GRPO's constant normaliser, RLOO's closed form, and the test split evaluated at the end (`grpo.test_at_end`)."""

from __future__ import annotations

import math
import os

import pytest
import torch
import yaml

from rl_algorithms.advantages.group import group_advantages
from rl_algorithms.losses import make_normalizer
from rl_apps import recipe_path
from rl_apps.cli import main
from rl_apps.commands.grpo import GRPORunConfig
from rl_core.config import load_config
from rl_core.logging import read_jsonl_metrics
from rl_core.types import ModelOutputs

PRESETS = ["grpo.yaml", "dapo.yaml", "gspo.yaml", "gdpo.yaml", "drgrpo.yaml", "cispo.yaml", "reinforce_pp.yaml", "rloo.yaml"]
MAIN = recipe_path("grpo_arithmetic_smollm2.yaml")
TASK_SECTIONS = ("model", "seed", "data", "env", "val_env", "generation", "policy")
TASK_LOOP_KEYS = ("batch_size", "num_generations_per_prompt", "max_steps", "temperature", "max_new_tokens",
                  "max_total_length", "val_every", "val_num_prompts")
# One short step on the tiny random model (its rewards are all 0, so the step is forced to train).
TINY = ["model=tiny-llama", "grpo.max_steps=1", "grpo.batch_size=2", "grpo.num_generations_per_prompt=2",
        "grpo.max_new_tokens=8", "grpo.max_total_length=128", "grpo.val_every=0", "checkpointing.enabled=false",
        "logger.tensorboard=false", "logger.progress_bar=false", "data.train_size=8", "export_hf=false",
        "grpo.skip_steps_without_signal=false"]


@pytest.fixture(autouse=True)
def _offline_cache(tmp_path_factory):
    os.environ.setdefault("RL_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "rl-cache"))


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_has_the_main_jobs_task_settings(preset):
    main_job = load_config(GRPORunConfig, MAIN, []).model_dump()
    cfg = load_config(GRPORunConfig, recipe_path(preset), []).model_dump()
    for section in TASK_SECTIONS:
        assert cfg[section] == main_job[section], section
    for key in TASK_LOOP_KEYS:
        assert cfg["grpo"][key] == main_job["grpo"][key], key


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_runs_one_step_on_a_tiny_model(preset, tmp_path):
    assert main(["grpo", "--config", recipe_path(preset), f"output_dir={tmp_path}", *TINY]) == 0
    steps = [r for r in read_jsonl_metrics(tmp_path / "metrics.jsonl") if "train/skipped" in r]
    assert [r["step"] for r in steps] == [1]
    assert steps[0]["train/skipped"] == 0.0 and math.isfinite(steps[0]["train/loss"])
    resolved = yaml.safe_load((tmp_path / "config.yaml").read_text())["loss"]
    expected = load_config(GRPORunConfig, recipe_path(preset), TINY).loss.model_dump()
    assert resolved == expected


def test_drgrpo_preset_is_the_papers_algorithm(capsys):
    assert main(["grpo", "--config", recipe_path("drgrpo.yaml"), "--print-config"]) == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert cfg["grpo"]["advantage"]["normalize_std"] is False
    assert (cfg["loss"]["reduction"], cfg["loss"]["constant_normalizer"]) == ("constant", 32)  # = max_new_tokens
    longer = load_config(GRPORunConfig, recipe_path("drgrpo.yaml"), ["grpo.max_new_tokens=48"])
    assert longer.loss.constant_normalizer == 48
    fixed = load_config(GRPORunConfig, recipe_path("drgrpo.yaml"), ["grpo.max_new_tokens=48", "loss.constant_normalizer=20"])
    assert fixed.loss.constant_normalizer == 20
    assert load_config(GRPORunConfig, MAIN, []).loss.constant_normalizer is None  # only for reduction=constant


def test_rloo_preset_is_the_papers_algorithm():
    """RLOO: the baseline of an answer is the mean reward of the other answers to its prompt (no std), and the
    loss is REINFORCE on the answer's summed log-probabilities over a fixed scale (valid sequences x max new
    tokens): its gradient on a token is -A / (S L) whatever the ratio, checked on a closed form."""
    cfg = load_config(GRPORunConfig, recipe_path("rloo.yaml"), [])
    advantage, loss_cfg = cfg.grpo.advantage, cfg.loss
    assert (advantage.estimator, advantage.baseline, advantage.normalize_std) == ("grpo", "leave_one_out", False)
    assert (loss_cfg.objective, loss_cfg.reduction, loss_cfg.constant_normalizer, loss_cfg.kl_coef) == \
        ("reinforce", "constant", 32, 0.0)
    rewards, groups = torch.tensor([1.5, 0.0, 0.5, 1.0, 0.0, 0.0]), torch.tensor([0, 0, 0, 1, 1, 1])
    adv = group_advantages(rewards, groups, baseline=advantage.baseline, normalize_std=advantage.normalize_std)
    torch.testing.assert_close(adv, torch.tensor([1.25, -1.0, -0.25, 1.0, -0.5, -0.5]))
    mask = torch.tensor([[0.0, 1, 1, 1], [0.0, 1, 1, 0], [0.0, 1, 0, 0], [0.0, 1, 1, 1], [0.0, 1, 1, 1], [0.0, 1, 0, 0]])
    prev = torch.full((6, 4), -1.0)
    logprobs = (prev + torch.tensor([0.3, -0.2, 0.1, 0.4])).clone().requires_grad_(True)  # ratios != 1: no ratio in REINFORCE
    batch = {"loss_mask": mask, "prev_logprobs": prev, "advantages": adv}
    loss, _ = loss_cfg.build()(ModelOutputs(logprobs=logprobs), batch, make_normalizer(batch))
    scale = 6 * 32
    assert loss.item() == pytest.approx(-(adv[:, None] * logprobs * mask).sum().item() / scale, abs=1e-6)
    loss.backward()
    torch.testing.assert_close(logprobs.grad, -adv[:, None] * mask / scale)


def test_test_split_is_evaluated_at_the_end(tmp_path):
    overrides = [*TINY, "grpo.val_every=1", "grpo.val_num_prompts=2", "data.validation_size=4",
                 "grpo.test_at_end=true", "grpo.test_num_prompts=3"]
    assert main(["grpo", "--config", MAIN, f"output_dir={tmp_path}", *overrides]) == 0
    records = read_jsonl_metrics(tmp_path / "metrics.jsonl")
    test = [r for r in records if any(k.startswith("test/") for k in r)]
    assert [r["step"] for r in test] == [1]
    assert {"test/accuracy", "test/reward/correct", "test/response_length_mean"} <= set(test[0])
    assert [r["step"] for r in records if "val/accuracy" in r] == [0, 1]


def test_a_training_time_budget_ends_the_run_and_the_test_split_follows(tmp_path, monkeypatch):
    # The loop's clock says each step took 10 s (a real tiny step can take under 10 ms), so 0.1 minutes
    # are spent by the first step: the run stops after it (not at max_steps=3), validates there as its
    # last step and evaluates the test split at that step.
    import itertools
    import types

    import rl_algorithms.loop

    ticks = itertools.count(step=10.0)  # read before and after each step
    monkeypatch.setattr(rl_algorithms.loop, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks)))
    overrides = [*TINY, "grpo.max_steps=3", "grpo.max_minutes=0.1", "grpo.val_every=2", "grpo.val_num_prompts=2",
                 "data.validation_size=4", "grpo.test_at_end=true", "grpo.test_num_prompts=3"]
    assert main(["grpo", "--config", MAIN, f"output_dir={tmp_path}", *overrides]) == 0
    records = read_jsonl_metrics(tmp_path / "metrics.jsonl")
    assert max(r["step"] for r in records if "train/loss" in r) == 1
    assert [r["step"] for r in records if "val/accuracy" in r] == [0, 1]
    assert [r["step"] for r in records if "test/accuracy" in r] == [1]


def test_test_split_prompts_are_not_validation_prompts():
    cfg = load_config(GRPORunConfig, MAIN, [])
    val = {s.metadata["problem"] for s in cfg.data.build("validation", 200)}
    test = {s.metadata["problem"] for s in cfg.data.build("test", 256)}
    assert len(test) == 256 and not val & test


def test_test_at_end_without_a_test_split_exits_2(tmp_path, capsys):
    out = tmp_path / "never"
    code = main(["grpo", "--config", MAIN, f"output_dir={out}", "data.kind=file", "data.train_path=x.jsonl",
                 "grpo.val_every=0", "grpo.test_at_end=true"])
    assert code == 2
    assert "grpo.test_at_end needs test prompts" in capsys.readouterr().err
    assert not out.exists()
