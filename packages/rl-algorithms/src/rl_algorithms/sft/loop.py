"""The SFT loop: batches of tokenised samples -> one optimizer step each on the masked NLL.

Simplifications, stated: the whole tokenised dataset sits in the driver's memory; the last incomplete
batch of an epoch is dropped; validation is the exact NLL over every held-out trained token.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rl_algorithms.checkpointing import CheckpointManager
from rl_algorithms.data.collate import collate_samples
from rl_algorithms.data.tokenize import TokenizedSample
from rl_algorithms.loop import Metrics, MetricsSink
from rl_algorithms.sft.config import SFTConfig
from rl_algorithms.supervised import in_chunks, supervised_train
from rl_core.protocols import TrainingBackend


def sft_train(cfg: SFTConfig, policy: TrainingBackend, train_data: Sequence[TokenizedSample], *, pad_token_id: int,
              val_data: Sequence[TokenizedSample] | None = None, logger: MetricsSink | None = None,
              checkpointer: CheckpointManager | None = None, seed: int = 0) -> list[Metrics]:
    """Train ``policy`` for ``cfg.max_steps`` steps; returns every step's metrics (index 0 holds the
    validation before training when there is one)."""
    def make_batch(samples, step, timer):
        return collate_samples(samples, pad_token_id), {}

    def validate(step: int) -> Metrics:
        return validation_loss(policy, val_data, pad_token_id, cfg.val_batch_size)

    return supervised_train(cfg, policy, train_data, make_batch, cfg.loss.build(),
                            validate=validate if val_data else None, logger=logger, checkpointer=checkpointer,
                            seed=seed)


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
