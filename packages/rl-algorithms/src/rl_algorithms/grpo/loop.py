"""The GRPO training loop.

One step: prompts -> ``num_generations_per_prompt`` samples each, graded by the environments ->
previous (and reference) logprobs from the policy (pi_old comes from the training forward itself
when the batch gets a single optimizer step) -> rewards and advantages -> one or more optimizer
steps -> refit the generation backend -> metrics, validation, checkpoint.

Simplifications, stated: the driver holds the whole step's batch; validation is a callback
(``validate_fn``) so that the loop does not know how a task is scored; with placement
``colocated`` the policy is offloaded (weights, gradients, optimizer state) while the engine
generates, and the engine sleeps from the end of generation to the refit; memory figures of both
phases are reported as ``memory/generate/*`` and ``memory/train/*``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from rl_algorithms.checkpointing import CheckpointManager
from rl_algorithms.draft import train_draft
from rl_algorithms.grpo.config import GRPOConfig, LossConfig
from rl_algorithms.grpo.data import PromptStream
from rl_algorithms.grpo.rewards import compute_rewards_and_advantages
from rl_algorithms.grpo.rollouts import generate_rollouts
from rl_algorithms.loop import Metrics, MetricsSink, Validate, last_step, refit, train_loop
from rl_algorithms.losses import loss_token_mask, mismatch_metrics, with_positive_token_count
from rl_algorithms.rollout.env_runner import StepRunner
from rl_core.batch import Batch, batch_size, select
from rl_core.protocols import Environment, GenerationBackend, LossFn, TrainingBackend
from rl_core.timer import Timer
from rl_core.types import PromptSample


def grpo_train(
    cfg: GRPOConfig,
    loss_cfg: LossConfig,
    policy: TrainingBackend,
    generation: GenerationBackend,
    tokenizer: Any,
    train_data: Sequence[PromptSample],
    environments: Mapping[str, Environment] | Environment,
    *,
    logger: MetricsSink | None = None,
    checkpointer: CheckpointManager | None = None,
    validate_fn: Validate | None = None,
    seed: int = 0,
    env_runner: StepRunner | None = None,
    test_fn: Validate | None = None,
) -> list[Metrics]:
    """Train ``policy`` with GRPO for ``cfg.max_steps`` steps or ``cfg.max_minutes`` of training (the skeleton is :func:`rl_algorithms.loop.train_loop`).

    Environments run in ``env_runner`` for the whole run (the caller shuts it down); without one,
    each step builds its own from ``cfg.env_runner`` (for Ray actors, pass one: they take seconds to start).

    Step metrics are logged as ``train/<name>`` and validation metrics (``validate_fn(step)``, every
    ``cfg.val_every`` steps, before the first and after the last) as ``val/<name>``. Returns one
    dict per logged step with the full names (the entry of step 0 holds the validation before
    training). ``test_fn(step)``, when given, runs once after the last step; its metrics are logged as
    ``test/<name>`` at that step (``grpo.test_at_end``)."""
    if cfg.prev_logprobs == "training_forward" and loss_cfg.kl_in_reward:
        raise ValueError("loss.kl_in_reward needs pi_old before training: set grpo.prev_logprobs to 'auto' or 'recompute'")
    loss_fn = loss_cfg.build()
    prompts = PromptStream(train_data, seed)

    def train_step(step: int, timer: Timer) -> Metrics:
        return grpo_step(cfg, loss_cfg, loss_fn, policy, generation, tokenizer, prompts, environments,
                         step=step, seed=seed, timer=timer, logger=logger, env_runner=env_runner)

    history = train_loop(cfg, policy, prompts, train_step, validate=validate_fn, logger=logger,
                         checkpointer=checkpointer, generation=generation)
    if test_fn is not None:
        final = last_step(history)
        test_metrics = test_fn(final)
        if logger is not None:
            logger.log(test_metrics, final, prefix="test")
        history.append({**{f"test/{k}": float(v) for k, v in test_metrics.items()}, "step": float(final)})
    return history


def grpo_step(
    cfg: GRPOConfig,
    loss_cfg: LossConfig,
    loss_fn: LossFn,
    policy: TrainingBackend,
    generation: GenerationBackend,
    tokenizer: Any,
    prompts: PromptStream,
    environments: Mapping[str, Environment] | Environment,
    *,
    step: int,
    seed: int,
    timer: Timer,
    logger: MetricsSink | None = None,
    env_runner: StepRunner | None = None,
) -> Metrics:
    """One GRPO step (0-based ``step``); returns its metrics (phase times are left in ``timer``)."""
    from rl_algorithms.rollout import episodes_to_batch

    metrics: Metrics = {}
    colocated = cfg.placement == "colocated"
    if colocated:  # the engine gets the device to itself; the previous step's refit is done
        policy.offload(weights=True)
    with timer.time("generate"):
        episodes, rollout_metrics = generate_rollouts(cfg, generation, tokenizer, prompts, environments, step=step,
                                                      seed=seed, env_runner=env_runner)
    metrics.update(rollout_metrics)
    log_examples(logger, episodes, cfg.log_samples, step + 1)
    metrics["throughput/generated_tokens_per_s"] = metrics["generated_tokens"] / max(timer.peek()["generate"], 1e-9)
    metrics.update(memory_metrics(policy, "generate"))
    if colocated:
        generation.sleep()
        policy.onload()

    trained = False
    if episodes:
        batch = episodes_to_batch(episodes, tokenizer.pad_token_id)
        # Without prev_logprobs in the batch the loss takes pi_old from its own forward (detached).
        need_prev = cfg.recompute_prev_logprobs(loss_cfg)
        if need_prev or loss_cfg.needs_reference:
            with timer.time("logprobs"):
                compute_prev_and_ref_logprobs(policy, batch, cfg.temperature, need_prev=need_prev,
                                              need_reference=loss_cfg.needs_reference)
        if need_prev:
            metrics.update({f"mismatch/{k}": v for k, v in
                            mismatch_metrics(batch["prev_logprobs"], batch["gen_logprobs"], loss_token_mask(batch)).items()})
        with timer.time("advantages"):
            metrics.update(compute_rewards_and_advantages(episodes, batch, cfg, loss_cfg))
        if has_learning_signal(batch, loss_cfg) or not cfg.skip_steps_without_signal:
            with timer.time("train"):
                metrics.update(train_on_batch(policy, batch, loss_fn, cfg, step=step, seed=seed))
            metrics.update(memory_metrics(policy, "train"))
            metrics["throughput/train_tokens_per_s"] = float(batch["attention_mask"].sum()) / max(timer.peek()["train"], 1e-9)
            trained = True
    metrics["skipped"] = 0.0 if trained else 1.0

    if colocated:
        generation.wake()
    if trained:
        with timer.time("refit"):
            refit(policy, generation)
    if episodes:  # generation.speculative.train_draft: the draft follows the refitted policy
        metrics.update(train_draft(generation, batch))
    return metrics


def memory_metrics(policy: TrainingBackend, phase: str) -> Metrics:
    """The policy's memory figures (GiB, largest over ranks) at the end of ``phase``."""
    return {f"memory/{phase}/{name}": value for name, value in policy.memory_metrics().items()}


def log_examples(logger: MetricsSink | None, episodes: Sequence[Any], count: int, step: int) -> None:
    """Send ``count`` episodes, spread over the batch, to ``logger.log_samples`` (when it has one):
    the prompt's last message, what followed it (model turns and observations), reward and parts."""
    log_samples = getattr(logger, "log_samples", None)
    if not episodes or count <= 0 or log_samples is None:
        return
    picked = [episodes[i * len(episodes) // min(count, len(episodes))] for i in range(min(count, len(episodes)))]
    log_samples([{
        "prompt": ep.sample.messages[-1]["content"] if ep.sample.messages else "",
        "turns": ep.messages[len(ep.sample.messages):],
        "reward": ep.reward,
        "reward_components": ep.reward_components,
        "truncated": ep.truncated,
        "env_error": ep.error,
    } for ep in picked], step)


def compute_prev_and_ref_logprobs(policy: TrainingBackend, batch: Batch, temperature: float, *,
                                  need_reference: bool, need_prev: bool = True) -> None:
    """Add ``prev_logprobs`` (the policy before this step's updates) and, for a KL term,
    ``ref_logprobs`` to ``batch``: on the ``loss_mask`` columns only (the prompt's need no LM head)."""
    if need_prev:
        batch["prev_logprobs"] = policy.logprobs(batch, temperature=temperature, loss_tokens_only=True).float()
    if need_reference:
        batch["ref_logprobs"] = policy.reference_logprobs(batch, temperature=temperature,
                                                          loss_tokens_only=True).float()


def has_learning_signal(batch: Batch, loss_cfg: LossConfig) -> bool:
    """False when no valid token has a non-zero advantage and no other loss term is on."""
    if (loss_cfg.kl_coef > 0 and not loss_cfg.kl_in_reward) or loss_cfg.positive_nll_coef > 0:
        return True
    mask = loss_token_mask(batch)
    advantages = batch["advantages"]
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1).expand_as(mask)
    return bool(((advantages != 0) & (mask > 0)).any())


def train_on_batch(policy: TrainingBackend, batch: Batch, loss_fn: LossFn, cfg: GRPOConfig, *, step: int, seed: int) -> Metrics:
    """``num_epochs`` passes of ``num_minibatches`` optimizer steps each; returns the mean metrics.
    Each optimizer step's rows carry the counts the loss normalises by beyond the backend's Normalizer."""
    n = batch_size(batch)
    per = math.ceil(n / cfg.num_minibatches)
    totals: dict[str, float] = defaultdict(float)
    calls = 0
    for epoch in range(cfg.num_epochs):
        if cfg.num_minibatches > 1:  # reshuffle rows between passes, deterministically
            generator = torch.Generator().manual_seed(seed * 7919 + step * 1009 + epoch)
            order = torch.randperm(n, generator=generator)
        else:
            order = torch.arange(n)
        for i in range(0, n, per):
            minibatch = select(batch, order[i:i + per])
            if getattr(loss_fn, "needs_positive_token_count", False):
                minibatch = with_positive_token_count(minibatch)
            for key, value in policy.train(minibatch, loss_fn, temperature=cfg.temperature).items():
                totals[key] += float(value)
            calls += 1
    return {key: value / calls for key, value in totals.items()}
