"""Student samples -> a training batch, and the teacher's and student's distributions on it."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rl_algorithms.rollout.batch import routing_tensor
from rl_core.batch import Batch
from rl_core.protocols import GenerationBackend, TrainingBackend
from rl_core.types import Completion, SamplingParams


def generate_batch(generation: GenerationBackend, prompts: Sequence[Sequence[int]], sampling: SamplingParams,
                   pad_token_id: int) -> Batch:
    """Sample ``sampling.n`` responses per prompt; rows are prompt + response, ``loss_mask`` on the response.

    Keys: ``input_ids``, ``attention_mask`` [B, T] long, ``loss_mask``, ``gen_logprobs`` [B, T] float,
    ``response_lengths`` [B] long; ``routed_experts`` [B, T, moe_layers, k] where the engine recorded them.
    """
    completions = [c for per_prompt in generation.generate(prompts, sampling) for c in per_prompt]
    return completions_to_batch(completions, pad_token_id)


def completions_to_batch(completions: Sequence[Completion], pad_token_id: int) -> Batch:
    length = max(len(c.prompt_token_ids) + len(c.token_ids) for c in completions)
    size = len(completions)
    batch = {
        "input_ids": torch.full((size, length), pad_token_id, dtype=torch.long),
        "attention_mask": torch.zeros((size, length), dtype=torch.long),
        "loss_mask": torch.zeros((size, length), dtype=torch.float32),
        "gen_logprobs": torch.zeros((size, length), dtype=torch.float32),
        "response_lengths": torch.tensor([len(c.token_ids) for c in completions], dtype=torch.long),
    }
    for row, c in enumerate(completions):
        p, n = len(c.prompt_token_ids), len(c.token_ids)
        batch["input_ids"][row, : p + n] = torch.tensor([*c.prompt_token_ids, *c.token_ids], dtype=torch.long)
        batch["attention_mask"][row, : p + n] = 1
        batch["loss_mask"][row, p : p + n] = 1.0
        batch["gen_logprobs"][row, p : p + n] = torch.tensor(c.logprobs, dtype=torch.float32)
    routed = [c.routed_experts for c in completions]
    if any(r is not None for r in routed):  # generation.record_routing: the student replays them
        batch["routed_experts"] = routing_tensor(routed, length)
    return batch


def add_teacher_topk(teacher: TrainingBackend, batch: Batch, k: int, temperature: float) -> None:
    """``teacher_topk_logits`` / ``teacher_topk_indices`` [B, T, k] of the teacher on ``batch``."""
    values, indices = teacher.topk_logits(batch, k, temperature=temperature)
    batch["teacher_topk_logits"] = values.float()
    batch["teacher_topk_indices"] = indices.long()


def full_logits(backend: TrainingBackend, batch: Batch, vocab_size: int, temperature: float) -> torch.Tensor:
    """[B, T, vocab_size] logits of ``backend`` on ``batch`` (no gradient), via a top-k over the whole
    vocabulary: the protocol's way to read a model's full distribution for evaluation."""
    values, indices = backend.topk_logits(batch, vocab_size, temperature=temperature)
    return torch.empty(values.shape, dtype=torch.float32).scatter_(-1, indices.long(), values.float())
