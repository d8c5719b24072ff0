"""The SFT loop: batches of tokenised samples -> one optimizer step each on the masked NLL.

Simplifications, stated: the whole tokenised dataset sits in the driver's memory; the last incomplete
batch of an epoch is dropped; validation is the exact NLL over every held-out trained token.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rl_algorithms.checkpointing import CheckpointManager
from rl_algorithms.data.collate import collate_samples
from rl_algorithms.data.sampler import EpochSampler
from rl_algorithms.data.tokenize import TokenizedSample
from rl_algorithms.loop_helpers import (
    Metrics,
    MetricsSink,
    in_chunks,
    maybe_checkpoint,
    maybe_resume,
    prefixed,
    record,
    run_validation,
    timed,
    validation_due,
)
from rl_algorithms.losses.nll import NLLLoss
from rl_algorithms.sft.config import SFTConfig
from rl_core.protocols import TrainingBackend


def sft_train(
    cfg: SFTConfig,
    policy: TrainingBackend,
    train_data: Sequence[TokenizedSample],
    *,
    pad_token_id: int,
    val_data: Sequence[TokenizedSample] | None = None,
    logger: MetricsSink | None = None,
    checkpointer: CheckpointManager | None = None,
    seed: int = 0,
) -> list[Metrics]:
    """Train ``policy`` for ``cfg.max_steps`` steps; returns every step's metrics (index 0 holds the
    validation before training when there is one)."""
    loss_fn = NLLLoss(reduction=cfg.loss_reduction)
    sampler = EpochSampler(len(train_data), cfg.batch_size, seed=seed, shuffle=cfg.shuffle)
    validate = (lambda: validation_loss(policy, val_data, pad_token_id, cfg.val_batch_size)) if val_data else None
    start_step, history = maybe_resume(checkpointer, policy, sampler)
    if start_step == 0 and validate is not None and cfg.val_every > 0 and cfg.val_at_start:
        history.append(record(logger, {"step": 0.0, **prefixed("val/", validate())}, 0))

    for step in range(start_step, cfg.max_steps):
        metrics: Metrics = {}
        batch = collate_samples([train_data[i] for i in sampler.next_batch()], pad_token_id)
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


def validation_loss(policy: TrainingBackend, samples: Sequence[TokenizedSample], pad_token_id: int,
                    batch_size: int) -> Metrics:
    """Mean NLL per trained token over ``samples`` (no gradient) and its perplexity."""
    total_nll = 0.0
    total_tokens = 0.0
    for chunk in in_chunks(samples, batch_size):
        batch = collate_samples(chunk, pad_token_id)
        logprobs = policy.logprobs(batch)  # [B, T]
        total_nll += float(-(logprobs * batch["loss_mask"]).sum())
        total_tokens += float(batch["loss_mask"].sum())
    nll = total_nll / max(total_tokens, 1.0)
    return {"nll": nll, "perplexity": float(torch.tensor(nll).exp())}
