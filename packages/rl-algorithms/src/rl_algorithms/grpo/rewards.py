"""Rewards -> advantages for one GRPO step (with DAPO's shaping and filtering)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rl_algorithms.advantages import (
    clip_advantages,
    gdpo_advantages,
    group_advantages,
    group_has_signal,
    overlong_filter,
    overlong_penalty,
    reinforce_pp_advantages,
)
from rl_algorithms.grpo.config import GRPOConfig, LossConfig
from rl_algorithms.losses import kl_penalized_rewards, loss_token_mask
from rl_core.batch import Batch


def response_lengths(episodes: Sequence[Any]) -> torch.Tensor:
    """[B] generated tokens of each episode (all model turns)."""
    return torch.tensor([int(sum(ep.loss_mask)) for ep in episodes], dtype=torch.long)


def valid_samples(episodes: Sequence[Any], cfg: GRPOConfig) -> torch.Tensor:
    """[B] bool: samples that take part in advantages and the loss (no environment error; not
    truncated when DAPO's overlong filtering is on)."""
    valid = torch.tensor([not ep.env_error for ep in episodes], dtype=torch.bool)
    if cfg.dapo.overlong_filtering:
        truncated = torch.tensor([bool(ep.truncated) for ep in episodes])
        valid = overlong_filter(valid.float(), truncated).bool()
    return valid


def shaped_rewards(episodes: Sequence[Any], cfg: GRPOConfig) -> torch.Tensor:
    """[B] environment rewards plus DAPO's overlong penalty (when configured)."""
    rewards = torch.tensor([float(ep.reward) for ep in episodes], dtype=torch.float32)
    if cfg.dapo.overlong_buffer_length is not None:
        max_length = cfg.max_new_tokens * cfg.max_turns
        rewards = rewards + overlong_penalty(response_lengths(episodes), max_length,
                                             cfg.dapo.overlong_buffer_length, cfg.dapo.overlong_penalty)
    return rewards


def reward_components(episodes: Sequence[Any]) -> dict[str, torch.Tensor]:
    """Named reward components as [B] tensors (a component an episode lacks counts as 0)."""
    names = sorted({name for ep in episodes for name in ep.reward_components})
    return {name: torch.tensor([float(ep.reward_components.get(name, 0.0)) for ep in episodes]) for name in names}


def group_ids(episodes: Sequence[Any]) -> torch.Tensor:
    return torch.tensor([int(ep.group_id) for ep in episodes], dtype=torch.long)


def groups_have_signal(groups: Sequence[Sequence[Any]], cfg: GRPOConfig) -> list[bool]:
    """Per group: would its advantages be non-zero? (DAPO dynamic sampling drops those that would not.)"""
    out = []
    for group in groups:
        valid = valid_samples(group, cfg).tolist()
        if cfg.advantage.estimator == "gdpo":
            components = reward_components(group)
            signal = any(group_has_signal(components[name].tolist(), valid)
                         for name in cfg.advantage.gdpo_weights if name in components)
        else:
            signal = group_has_signal(shaped_rewards(group, cfg).tolist(), valid)
        out.append(signal)
    return out


def compute_rewards_and_advantages(episodes: Sequence[Any], batch: Batch, cfg: GRPOConfig, loss_cfg: LossConfig) -> dict[str, float]:
    """Add ``rewards`` [B], ``sample_mask`` [B] and ``advantages`` ([B], or [B, T] for REINFORCE++) to
    ``batch`` (which must already hold ``prev_logprobs``, and ``ref_logprobs`` for KL in the reward).
    Returns reward metrics."""
    rewards = shaped_rewards(episodes, cfg)
    valid = valid_samples(episodes, cfg)
    groups = group_ids(episodes)
    mask = batch["loss_mask"].float()
    metrics: dict[str, float] = {}
    if loss_cfg.kl_in_reward and loss_cfg.kl_coef > 0:
        before = rewards
        rewards = kl_penalized_rewards(rewards, batch["prev_logprobs"], batch["ref_logprobs"], mask,
                                       loss_cfg.kl_coef, loss_cfg.kl_estimator)
        metrics["reward_kl_penalty"] = float((before - rewards).mean())

    adv_cfg = cfg.advantage
    if adv_cfg.estimator == "grpo":
        advantages = group_advantages(rewards, groups, valid, baseline=adv_cfg.baseline, normalize_std=adv_cfg.normalize_std)
    elif adv_cfg.estimator == "gdpo":
        advantages = gdpo_advantages(reward_components(episodes), adv_cfg.gdpo_weights, groups, valid)
    else:
        advantages = reinforce_pp_advantages(rewards, groups, mask, valid)
    advantages = clip_advantages(advantages, adv_cfg.clip_low, adv_cfg.clip_high)

    sample_mask = valid.float()
    if "sample_mask" in batch:
        sample_mask = sample_mask * batch["sample_mask"].float()
    batch["rewards"] = rewards
    batch["sample_mask"] = sample_mask
    batch["advantages"] = advantages
    token_mask = loss_token_mask(batch)
    adv_tokens = advantages if advantages.dim() == 2 else advantages.unsqueeze(1).expand_as(token_mask)
    metrics["advantage/abs_mean"] = float((adv_tokens.abs() * token_mask).sum() / token_mask.sum().clamp(min=1))
    metrics["advantage/nonzero_fraction"] = float(((adv_tokens != 0).float() * token_mask).sum() / token_mask.sum().clamp(min=1))
    metrics["valid_fraction"] = float(sample_mask.mean())
    if cfg.dapo.overlong_buffer_length is not None:
        metrics["reward_shaped_mean"] = float(rewards.mean())
    return metrics


def episode_metrics(episodes: Sequence[Any]) -> dict[str, float]:
    """Reward (and per component), length, turn and truncation statistics of the raw episodes, plus
    ``accuracy`` (the mean ``correct`` component) when the environment reports one."""
    from rl_algorithms.rollout import rollout_metrics

    metrics = rollout_metrics(episodes)
    if "reward/correct" in metrics:
        metrics["accuracy"] = metrics["reward/correct"]
    return metrics
