"""Rewards -> advantages for a GRPO step, on hand-made episodes (real Episode objects, no model)."""

from __future__ import annotations

import math

import pytest
import torch

from rl_algorithms.grpo import GRPOConfig, LossConfig, compute_rewards_and_advantages
from rl_algorithms.grpo.rewards import groups_have_signal, shaped_rewards
from rl_algorithms.grpo.rollouts import group_episodes, renumber_groups
from rl_algorithms.rollout import Episode, episodes_to_batch
from rl_core.types import PromptSample

SAMPLE = PromptSample(messages=[{"role": "user", "content": "1+1?"}])


def episode(group, reward, response_length=2, truncated=False, env_error=False, **components):
    prompt = [5, 6]
    return Episode(sample=SAMPLE, token_ids=prompt + [7] * response_length, loss_mask=[0, 0] + [1] * response_length,
                   gen_logprobs=[0.0, 0.0] + [-0.5] * response_length, prompt_length=2, reward=reward,
                   reward_components=dict(components), truncated=truncated, env_error=env_error, group_id=group)


def batch_of(episodes):
    batch = episodes_to_batch(episodes, pad_token_id=0)
    batch["prev_logprobs"] = batch["gen_logprobs"].clone()
    return batch


def test_grpo_advantages_and_masks():
    episodes = [episode(0, 1.0), episode(0, 0.0), episode(0, 0.0, env_error=True), episode(1, 1.0), episode(1, 1.0)]
    batch = batch_of(episodes)
    metrics = compute_rewards_and_advantages(episodes, batch, GRPOConfig(), LossConfig())
    h = 0.5 / math.sqrt(0.5)  # group 0 over its two valid samples: mean 0.5, Bessel std sqrt(0.5)
    torch.testing.assert_close(batch["advantages"], torch.tensor([h, -h, 0.0, 0.0, 0.0]), atol=1e-5, rtol=0)
    torch.testing.assert_close(batch["sample_mask"], torch.tensor([1.0, 1, 0, 1, 1]))
    assert metrics["valid_fraction"] == pytest.approx(0.8)
    assert metrics["advantage/nonzero_fraction"] == pytest.approx(0.5)  # 2 of the 4 valid samples


def test_dapo_overlong_shaping_and_filtering():
    cfg = GRPOConfig(max_new_tokens=10, dapo={"overlong_buffer_length": 4, "overlong_filtering": True})
    episodes = [episode(0, 1.0, response_length=6), episode(0, 1.0, response_length=8),
                episode(0, 0.0, response_length=10, truncated=True)]
    # L_exp = 6: lengths 6, 8, 10 -> penalties 0, -0.5, -1.
    torch.testing.assert_close(shaped_rewards(episodes, cfg), torch.tensor([1.0, 0.5, -1.0]))
    batch = batch_of(episodes)
    compute_rewards_and_advantages(episodes, batch, cfg, LossConfig())
    torch.testing.assert_close(batch["sample_mask"], torch.tensor([1.0, 1.0, 0.0]))
    # Two valid samples, rewards 1 and 0.5: +-0.25 / Bessel std (0.3536).
    h = 0.25 / math.sqrt(0.125)
    torch.testing.assert_close(batch["advantages"], torch.tensor([h, -h, 0.0]), atol=1e-5, rtol=0)


def test_kl_in_reward_uses_prev_and_ref_logprobs():
    episodes = [episode(0, 1.0), episode(0, 0.0)]
    batch = batch_of(episodes)
    batch["ref_logprobs"] = batch["prev_logprobs"] - 0.25 * batch["loss_mask"]  # k1 = 0.25 per token, 2 tokens
    cfg = LossConfig(kl_coef=0.1, kl_in_reward=True, kl_estimator="k1")
    metrics = compute_rewards_and_advantages(episodes, batch, GRPOConfig(advantage={"normalize_std": False}), cfg)
    torch.testing.assert_close(batch["rewards"], torch.tensor([0.95, -0.05]))
    assert metrics["reward_kl_penalty"] == pytest.approx(0.05)


def test_gdpo_and_reinforce_pp_estimators():
    episodes = [episode(0, 0, correct=1.0, format=1.0), episode(0, 0, correct=0.0, format=1.0),
                episode(1, 0, correct=1.0, format=0.0), episode(1, 0, correct=1.0, format=1.0)]
    batch = batch_of(episodes)
    cfg = GRPOConfig(advantage={"estimator": "gdpo", "gdpo_weights": {"correct": 1.0, "format": 0.5}})
    compute_rewards_and_advantages(episodes, batch, cfg, LossConfig())
    std, h = math.sqrt(1.25 / 3), math.sqrt(0.5)
    torch.testing.assert_close(batch["advantages"], torch.tensor([h / std, -h / std, -0.5 * h / std, 0.5 * h / std]),
                               atol=1e-5, rtol=0)
    episodes = [episode(0, 1.0), episode(0, 0.0)]
    batch = batch_of(episodes)
    compute_rewards_and_advantages(episodes, batch, GRPOConfig(advantage={"estimator": "reinforce_pp"}), LossConfig())
    assert batch["advantages"].shape == batch["loss_mask"].shape
    assert batch["advantages"][0, 2:].tolist() == pytest.approx([1 / math.sqrt(4 / 3)] * 2, abs=1e-5)


def test_signal_per_group_and_renumbering():
    cfg = GRPOConfig()
    groups = group_episodes([episode(3, 1.0), episode(3, 1.0), episode(8, 0.0), episode(8, 1.0)])
    assert groups_have_signal(groups, cfg) == [False, True]
    flat = renumber_groups([groups[1], groups[0]])
    assert [ep.group_id for ep in flat] == [0, 0, 1, 1] and flat[0].reward == 0.0
