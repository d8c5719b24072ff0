"""Generation for one GRPO step: n samples per prompt, graded, with DAPO's dynamic sampling."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from rl_algorithms.advantages import DynamicSamplingBuffer
from rl_algorithms.grpo.config import GRPOConfig
from rl_algorithms.grpo.data import PromptStream
from rl_algorithms.grpo.rewards import episode_metrics, groups_have_signal
from rl_algorithms.loop import step_seed
from rl_algorithms.rollout.env_runner import StepRunner
from rl_core.protocols import Environment, GenerationBackend
from rl_core.types import SamplingParams


def sampling_params(cfg: GRPOConfig, tokenizer: Any, seed: int | None) -> SamplingParams:
    return SamplingParams(
        max_new_tokens=cfg.max_new_tokens,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        top_k=cfg.top_k,
        stop_token_ids=tuple(t for t in [tokenizer.eos_token_id] if t is not None),
        stop_strings=tuple(cfg.stop_strings),
        seed=seed,
    )


def group_episodes(episodes: list[Any]) -> list[list[Any]]:
    """Episodes grouped by ``group_id``, in order of first appearance."""
    groups: dict[int, list[Any]] = {}
    for ep in episodes:
        groups.setdefault(ep.group_id, []).append(ep)
    return list(groups.values())


def renumber_groups(groups: list[list[Any]]) -> list[Any]:
    """Flatten groups, giving group i the ``group_id`` i (episodes from several rounds stay distinct)."""
    out = []
    for i, group in enumerate(groups):
        out.extend(dataclasses.replace(ep, group_id=i) for ep in group)
    return out


def generate_rollouts(cfg: GRPOConfig, generation: GenerationBackend, tokenizer: Any, prompts: PromptStream,
                      environments: Mapping[str, Environment] | Environment, *, step: int, seed: int,
                      env_runner: StepRunner | None = None) -> tuple[list[Any], dict[str, float]]:
    """Episodes of ``batch_size`` groups of ``num_generations_per_prompt`` samples, and
    metrics of everything generated (rewards, lengths, truncation, tokens).

    With DAPO dynamic sampling, groups whose rewards are all equal are dropped and more prompts are
    generated (at most ``dapo.max_extra_rounds`` extra rounds); the step then trains on the groups it
    collected, possibly fewer than asked for. Environments run in ``env_runner`` (kept for the next
    step), or in one built from ``cfg.env_runner`` for this call only.
    """
    if env_runner is None:
        runner = cfg.env_runner.build(environments)
        try:
            return generate_rollouts(cfg, generation, tokenizer, prompts, environments, step=step, seed=seed,
                                     env_runner=runner)
        finally:
            runner.shutdown()
    from rl_algorithms.rollout import run_rollouts  # written alongside; imported late to keep imports light

    buffer: DynamicSamplingBuffer[list[Any]] = DynamicSamplingBuffer(
        target_groups=cfg.batch_size,
        max_extra_rounds=cfg.dapo.max_extra_rounds if cfg.dapo.dynamic_sampling else 0,
    )
    all_episodes: list[Any] = []
    while True:
        missing = cfg.batch_size - len(buffer.kept) if cfg.dapo.dynamic_sampling else cfg.batch_size
        samples = prompts.take(missing)
        episodes = run_rollouts(
            generation, tokenizer, samples, environments,
            sampling_params(cfg, tokenizer, step_seed(seed, step, buffer.rounds)),
            num_generations_per_prompt=cfg.num_generations_per_prompt,
            max_turns=cfg.max_turns,
            max_total_length=cfg.max_total_length,
            env_timeout_s=cfg.env_runner.timeout_s,
            env_runner=env_runner,
        )
        all_episodes.extend(episodes)
        groups = group_episodes(episodes)
        has_signal = groups_have_signal(groups, cfg) if cfg.dapo.dynamic_sampling else [True] * len(groups)
        buffer.add_round(groups, has_signal)
        if not buffer.needs_more:
            break
    # Reward statistics cover every generated sample, also those dynamic sampling dropped.
    metrics = episode_metrics(all_episodes)
    metrics["generated_tokens"] = float(sum(int(sum(ep.loss_mask)) for ep in all_episodes))
    speculative = getattr(generation, "speculative", None)  # a native engine's speculative decoding
    if speculative is not None:
        metrics.update({f"speculative/{name}": value for name, value in speculative.pop_metrics().items()})
    if cfg.dapo.dynamic_sampling:
        metrics.update(buffer.metrics())
    return renumber_groups(buffer.take()), metrics
