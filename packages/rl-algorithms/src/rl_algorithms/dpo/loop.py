"""The DPO loop: batches of preference pairs -> reference logprobs -> one optimizer step on the DPO loss.

The batch interleaves pairs (rows 2i chosen, 2i+1 rejected; :func:`rl_algorithms.data.collate_pairs`),
so the training backend must split it into even-sized micro-batches in order (no packing or dynamic
batching). The ``rl dpo`` command checks the backend config for that; a loss that receives a split pair
raises (:func:`rl_algorithms.data.collate.split_pairs`).
"""

from __future__ import annotations

from collections.abc import Sequence

from rl_algorithms.checkpointing import CheckpointManager
from rl_algorithms.data.collate import collate_pairs
from rl_algorithms.data.tokenize import TokenizedSample
from rl_algorithms.dpo.config import DPOConfig
from rl_algorithms.loop import Metrics, MetricsSink
from rl_algorithms.losses.dpo import DPOLoss
from rl_algorithms.supervised import evaluate_loss, in_chunks, supervised_train
from rl_core.batch import Batch
from rl_core.protocols import TrainingBackend
from rl_core.types import ModelOutputs

Pair = tuple[TokenizedSample, TokenizedSample]


def dpo_train(cfg: DPOConfig, policy: TrainingBackend, train_pairs: Sequence[Pair], *, pad_token_id: int,
              val_pairs: Sequence[Pair] | None = None, logger: MetricsSink | None = None,
              checkpointer: CheckpointManager | None = None, seed: int = 0) -> list[Metrics]:
    """Train ``policy`` with DPO for ``cfg.max_steps`` steps; returns every step's metrics."""
    loss_fn = cfg.loss.build()

    def make_batch(pairs, step, timer):
        batch = collate_pairs(pairs, pad_token_id)
        with timer.time("reference"):
            add_reference_logprobs(policy, batch)
        return batch, {}

    def validate(step: int) -> Metrics:
        return dpo_validation(policy, loss_fn, val_pairs, pad_token_id, cfg.val_batch_size)

    return supervised_train(cfg, policy, train_pairs, make_batch, loss_fn, validate=validate if val_pairs else None,
                            logger=logger, checkpointer=checkpointer, seed=seed)


def add_reference_logprobs(policy: TrainingBackend, batch: Batch) -> None:
    """``ref_logprobs`` [B, T]: the frozen reference (initial weights, or the LoRA base), on the
    ``loss_mask`` columns (the loss reads no other)."""
    batch["ref_logprobs"] = policy.reference_logprobs(batch, loss_tokens_only=True).float()


def dpo_validation(policy: TrainingBackend, loss_fn: DPOLoss, pairs: Sequence[Pair], pad_token_id: int,
                   pairs_per_batch: int) -> Metrics:
    """The DPO loss and its metrics (accuracy, rewards, margin) over all held-out pairs, no gradient.

    The loss is evaluated here on the driver from the backend's logprobs."""
    batches = [collate_pairs(chunk, pad_token_id) for chunk in in_chunks(pairs, pairs_per_batch)]

    def outputs_of(batch: Batch) -> ModelOutputs:
        add_reference_logprobs(policy, batch)
        return ModelOutputs(logprobs=policy.logprobs(batch, loss_tokens_only=True).float())

    return evaluate_loss(loss_fn, batches, outputs_of)
