"""Episodes -> a training Batch, and summary metrics of a set of episodes."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import torch

from rl_algorithms.rollout.episode import Episode
from rl_algorithms.rollout.image_prompts import episode_image_rows
from rl_core.batch import Batch
from rl_core.models.moe import NOT_RECORDED, ROUTING_DTYPE


def episodes_to_batch(episodes: Sequence[Episode], pad_token_id: int) -> Batch:
    """Right-padded tensors, one row per episode.

    Keys: ``input_ids`` [B, T] long, ``attention_mask`` [B, T] long, ``loss_mask`` [B, T] float,
    ``gen_logprobs`` [B, T] float, ``rewards`` [B] float, ``group_ids`` [B] long, ``sample_indices`` [B]
    long, ``truncated`` [B] bool, ``env_error`` [B] bool, ``prompt_lengths`` [B] long,
    ``response_lengths`` [B] long (generated tokens over all turns), ``num_turns`` [B] long, one
    ``reward_component.<name>`` [B] float per reward component (0 where an episode lacks it); prompts with
    images add their image rows and ``mm_token_type_ids`` (``image_prompts.episode_image_rows``); when
    the engine recorded MoE routing, ``routed_experts`` [B, T, moe_layers, k] int16 (-1 where nothing
    was recorded).
    """
    if not episodes:
        raise ValueError("episodes_to_batch needs at least one episode")
    length = max(len(ep.token_ids) for ep in episodes)
    size = len(episodes)
    input_ids = torch.full((size, length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((size, length), dtype=torch.long)
    loss_mask = torch.zeros((size, length), dtype=torch.float32)
    gen_logprobs = torch.zeros((size, length), dtype=torch.float32)
    for row, ep in enumerate(episodes):
        n = len(ep.token_ids)
        input_ids[row, :n] = torch.tensor(ep.token_ids, dtype=torch.long)
        attention_mask[row, :n] = 1
        loss_mask[row, :n] = torch.tensor(ep.loss_mask, dtype=torch.float32)
        gen_logprobs[row, :n] = torch.tensor(ep.gen_logprobs, dtype=torch.float32)
    batch: Batch = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "loss_mask": loss_mask,
        "gen_logprobs": gen_logprobs,
        "rewards": torch.tensor([ep.reward for ep in episodes], dtype=torch.float32),
        "group_ids": torch.tensor([ep.group_id for ep in episodes], dtype=torch.long),
        "sample_indices": torch.tensor([ep.sample_index for ep in episodes], dtype=torch.long),
        "truncated": torch.tensor([ep.truncated for ep in episodes], dtype=torch.bool),
        "env_error": torch.tensor([ep.env_error for ep in episodes], dtype=torch.bool),
        "prompt_lengths": torch.tensor([ep.prompt_length for ep in episodes], dtype=torch.long),
        "response_lengths": torch.tensor([ep.response_length for ep in episodes], dtype=torch.long),
        "num_turns": torch.tensor([ep.num_turns for ep in episodes], dtype=torch.long),
    }
    routed = [ep.routed_experts for ep in episodes]
    if any(r is not None for r in routed):
        batch["routed_experts"] = routing_tensor(routed, length)
    for name in sorted({name for ep in episodes for name in ep.reward_components}):
        batch[f"reward_component.{name}"] = torch.tensor(
            [ep.reward_components.get(name, 0.0) for ep in episodes], dtype=torch.float32)
    batch.update(episode_image_rows(episodes, length))  # prompts with images: their tensors as rows
    return batch


def routing_tensor(records: Sequence[torch.Tensor | None], length: int) -> torch.Tensor:
    """Right-padded ``[B, length, moe_layers, k]`` routing records, -1 (not recorded) around them."""
    shape = next(r for r in records if r is not None).shape[1:]
    out = torch.full((len(records), length, *shape), NOT_RECORDED, dtype=ROUTING_DTYPE)
    for row, record in enumerate(records):
        if record is not None:
            record = record[:length]
            out[row, : record.shape[0]] = record
    return out


def rollout_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """Means and extremes of rewards, lengths and turns; truncation and environment-error counts;
    reward components (``reward/<name>``) and environment metrics (``env/<name>``) averaged."""
    if not episodes:
        return {"episodes": 0.0}
    rewards = [ep.reward for ep in episodes]
    lengths = [ep.response_length for ep in episodes]
    turns = [ep.num_turns for ep in episodes]
    count = len(episodes)
    metrics = {
        "episodes": float(count),
        "reward_mean": statistics.fmean(rewards),
        "reward_std": statistics.pstdev(rewards),
        "reward_min": min(rewards),
        "reward_max": max(rewards),
        "response_length_mean": statistics.fmean(lengths),
        "response_length_max": float(max(lengths)),
        "total_length_mean": statistics.fmean(len(ep.token_ids) for ep in episodes),
        "num_turns_mean": statistics.fmean(turns),
        "num_turns_max": float(max(turns)),
        "truncated_fraction": sum(ep.truncated for ep in episodes) / count,
        "max_turns_reached_fraction": sum(ep.max_turns_reached for ep in episodes) / count,
        "env_errors": float(sum(ep.env_error for ep in episodes)),
        "env_error_fraction": sum(ep.env_error for ep in episodes) / count,
    }
    for name in sorted({name for ep in episodes for name in ep.reward_components}):
        metrics[f"reward/{name}"] = statistics.fmean(ep.reward_components.get(name, 0.0) for ep in episodes)
    for name in sorted({name for ep in episodes for name in ep.metrics}):
        values = [ep.metrics[name] for ep in episodes if name in ep.metrics]
        metrics[f"env/{name}"] = statistics.fmean(values)
    return metrics
