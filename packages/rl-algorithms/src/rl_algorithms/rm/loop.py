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
from rl_algorithms.data.tokenize import TokenizedSample
from rl_algorithms.loop import Metrics, MetricsSink
from rl_algorithms.losses.bradley_terry import BradleyTerryLoss
from rl_algorithms.rm.config import RMConfig
from rl_algorithms.supervised import evaluate_loss, in_chunks, supervised_train
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


def rm_train(cfg: RMConfig, policy: RewardModelBackend, train_pairs: Sequence[Pair], *, pad_token_id: int,
             val_pairs: Sequence[Pair] | None = None, logger: MetricsSink | None = None,
             checkpointer: CheckpointManager | None = None, seed: int = 0) -> list[Metrics]:
    """Train a reward model for ``cfg.max_steps`` steps; returns every step's metrics."""
    loss_fn = cfg.loss.build()

    def make_batch(pairs, step, timer):
        return collate_pairs(pairs, pad_token_id), {}

    def validate(step: int) -> Metrics:
        return rm_validation(policy, loss_fn, val_pairs, pad_token_id, cfg.val_batch_size)

    return supervised_train(cfg, policy, train_pairs, make_batch, loss_fn, validate=validate if val_pairs else None,
                            logger=logger, checkpointer=checkpointer, seed=seed)


def rm_validation(policy: RewardModelBackend, loss_fn: BradleyTerryLoss, pairs: Sequence[Pair], pad_token_id: int,
                  pairs_per_batch: int) -> Metrics:
    """The Bradley-Terry loss, accuracy and score statistics over all held-out pairs."""
    batches = [collate_pairs(chunk, pad_token_id) for chunk in in_chunks(pairs, pairs_per_batch)]

    def outputs_of(batch: Batch) -> ModelOutputs:
        return ModelOutputs(logprobs=torch.zeros(batch["input_ids"].shape), scores=policy.scores(batch).float())

    return evaluate_loss(loss_fn, batches, outputs_of)
