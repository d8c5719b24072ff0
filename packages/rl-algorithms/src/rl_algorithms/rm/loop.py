"""The reward-model loop: batches of preference pairs -> one optimizer step on the Bradley-Terry loss.

The training backend runs with ``task: reward_model`` (an HF sequence-classification model with one
label), so ``ModelOutputs.scores`` holds each row's score at its last real token. Validation reads
scores through the backend's ``scores(batch)`` (see :class:`RewardModelBackend`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch

from rl_algorithms.checkpointing import CheckpointManager
from rl_algorithms.data.collate import collate_pairs
from rl_algorithms.data.sampler import EpochSampler
from rl_algorithms.data.tokenize import TokenizedSample
from rl_algorithms.loop_helpers import (
    Metrics,
    MetricsSink,
    in_chunks,
    maybe_checkpoint,
    maybe_resume,
    normalizer_of,
    prefixed,
    record,
    run_validation,
    timed,
    validation_due,
)
from rl_algorithms.losses.bradley_terry import BradleyTerryLoss
from rl_algorithms.rm.config import RMConfig
from rl_core.batch import Batch
from rl_core.protocols import TrainingBackend
from rl_core.types import ModelOutputs

Pair = tuple[TokenizedSample, TokenizedSample]


@runtime_checkable
class RewardModelBackend(TrainingBackend, Protocol):
    """A training backend built with ``task: reward_model``."""

    def scores(self, batch: Batch) -> torch.Tensor:
        """[B] scalar scores at each sequence's last real token (no gradient)."""
        ...


def rm_train(
    cfg: RMConfig,
    policy: RewardModelBackend,
    train_pairs: Sequence[Pair],
    *,
    pad_token_id: int,
    val_pairs: Sequence[Pair] | None = None,
    logger: MetricsSink | None = None,
    checkpointer: CheckpointManager | None = None,
    seed: int = 0,
) -> list[Metrics]:
    """Train a reward model for ``cfg.max_steps`` steps; returns every step's metrics."""
    loss_fn = cfg.build_loss()
    sampler = EpochSampler(len(train_pairs), cfg.pairs_per_step, seed=seed, shuffle=cfg.shuffle)
    validate = (lambda: rm_validation(policy, loss_fn, val_pairs, pad_token_id, cfg.val_pairs_per_batch)) if val_pairs else None
    start_step, history = maybe_resume(checkpointer, policy, sampler)
    if start_step == 0 and validate is not None and cfg.val_every > 0 and cfg.val_at_start:
        history.append(record(logger, {"step": 0.0, **prefixed("val/", validate())}, 0))

    for step in range(start_step, cfg.max_steps):
        metrics: Metrics = {}
        batch = collate_pairs([train_pairs[i] for i in sampler.next_batch()], pad_token_id)
        with timed(metrics, "train"):
            metrics.update(prefixed("train/", policy.train(batch, loss_fn)))
        done = step + 1
        last = done == cfg.max_steps
        if validation_due(cfg.val_every, done, last):
            run_validation(validate, metrics)
        metrics.update(step=float(done), epoch=float(sampler.epoch))
        history.append(record(logger, metrics, done))
        maybe_checkpoint(checkpointer, done, last, policy, sampler, history)
    return history


def rm_validation(policy: RewardModelBackend, loss_fn: BradleyTerryLoss, pairs: Sequence[Pair], pad_token_id: int,
                  pairs_per_batch: int) -> Metrics:
    """The Bradley-Terry loss, accuracy and score statistics over all held-out pairs."""
    batches = [collate_pairs(chunk, pad_token_id) for chunk in in_chunks(pairs, pairs_per_batch)]
    normalizer = normalizer_of(batches)
    totals: Metrics = {}
    for batch in batches:
        outputs = ModelOutputs(logprobs=torch.zeros(batch["input_ids"].shape), scores=policy.scores(batch).float())
        loss, metrics = loss_fn(outputs, batch, normalizer)
        for key, value in {"loss": float(loss), **metrics}.items():
            totals[key] = totals.get(key, 0.0) + value
    return totals
