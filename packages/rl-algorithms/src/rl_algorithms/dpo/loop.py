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
from rl_algorithms.data.sampler import EpochSampler
from rl_algorithms.data.tokenize import TokenizedSample
from rl_algorithms.dpo.config import DPOConfig
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
from rl_algorithms.losses.dpo import DPOLoss
from rl_core.batch import Batch
from rl_core.protocols import TrainingBackend
from rl_core.types import ModelOutputs

Pair = tuple[TokenizedSample, TokenizedSample]


def dpo_train(
    cfg: DPOConfig,
    policy: TrainingBackend,
    train_pairs: Sequence[Pair],
    *,
    pad_token_id: int,
    val_pairs: Sequence[Pair] | None = None,
    logger: MetricsSink | None = None,
    checkpointer: CheckpointManager | None = None,
    seed: int = 0,
) -> list[Metrics]:
    """Train ``policy`` with DPO for ``cfg.max_steps`` steps; returns every step's metrics."""
    loss_fn = cfg.build_loss()
    sampler = EpochSampler(len(train_pairs), cfg.pairs_per_step, seed=seed, shuffle=cfg.shuffle)
    validate = (lambda: dpo_validation(policy, loss_fn, val_pairs, pad_token_id, cfg.val_pairs_per_batch)) if val_pairs else None
    start_step, history = maybe_resume(checkpointer, policy, sampler)
    if start_step == 0 and validate is not None and cfg.val_every > 0 and cfg.val_at_start:
        history.append(record(logger, {"step": 0.0, **prefixed("val/", validate())}, 0))

    for step in range(start_step, cfg.max_steps):
        metrics: Metrics = {}
        batch = collate_pairs([train_pairs[i] for i in sampler.next_batch()], pad_token_id)
        with timed(metrics, "reference"):
            add_reference_logprobs(policy, batch)
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


def add_reference_logprobs(policy: TrainingBackend, batch: Batch) -> None:
    """``ref_logprobs`` [B, T]: the frozen reference (initial weights, or the LoRA base)."""
    batch["ref_logprobs"] = policy.reference_logprobs(batch).float()


def dpo_validation(policy: TrainingBackend, loss_fn: DPOLoss, pairs: Sequence[Pair], pad_token_id: int,
                   pairs_per_batch: int) -> Metrics:
    """The DPO loss and its metrics (accuracy, rewards, margin) over all held-out pairs, no gradient.

    The loss is evaluated here on the driver from the backend's logprobs; every chunk uses the
    normaliser of the whole set, so the chunk values sum to the full-set averages."""
    batches = [collate_pairs(chunk, pad_token_id) for chunk in in_chunks(pairs, pairs_per_batch)]
    normalizer = normalizer_of(batches)
    totals: Metrics = {}
    for batch in batches:
        add_reference_logprobs(policy, batch)
        loss, metrics = loss_fn(ModelOutputs(logprobs=policy.logprobs(batch).float()), batch, normalizer)
        for key, value in {"loss": float(loss), **metrics}.items():
            totals[key] = totals.get(key, 0.0) + value
    return totals

