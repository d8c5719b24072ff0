"""Masked negative log-likelihood: the SFT loss.

``L = sum_t -logpi_theta,t * mask_t / (valid tokens in the GLOBAL batch)`` (``token`` reduction), or each
sequence's mean NLL averaged over the global number of sequences (``sequence``). Batch keys:
``loss_mask`` [B, T] (1 on trained tokens, e.g. assistant turns), optional ``sample_mask`` [B].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rl_algorithms.losses.masking import Reduction, loss_token_mask, reduce_loss
from rl_core.batch import Batch
from rl_core.types import ModelOutputs, Normalizer


@dataclass
class NLLLoss:
    """Supervised fine-tuning loss; a picklable :class:`~rl_core.protocols.LossFn`."""

    reduction: Reduction = "token"
    """``token``: mean over all trained tokens of the batch. ``sequence``: mean of per-sequence means."""

    needs_logits = False

    def __post_init__(self) -> None:
        if self.reduction not in ("token", "sequence"):
            raise ValueError(f"reduction must be 'token' or 'sequence', got {self.reduction!r}")

    def __call__(self, outputs: ModelOutputs, batch: Batch, normalizer: Normalizer) -> tuple[torch.Tensor, dict[str, float]]:
        mask = loss_token_mask(batch)  # [B, T]
        loss = reduce_loss(-outputs.logprobs.float(), mask, normalizer, self.reduction)
        return loss, {"nll": float(loss.item()), "num_tokens": float(mask.sum().item())}
