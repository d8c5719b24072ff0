"""Masks and reductions shared by the policy losses.

Every loss works on right-padded ``[B, T]`` tensors. The tokens a loss sees are
``loss_mask * sample_mask[:, None]``; reductions divide by the GLOBAL counts in the
:class:`~rl_core.types.Normalizer`, so losses (and metrics) computed on micro-batches sum to the value
of the whole batch.
"""

from __future__ import annotations

from typing import Literal

import torch

from rl_core.batch import Batch
from rl_core.types import Normalizer

Reduction = Literal["token", "sequence", "constant"]


def loss_token_mask(batch: Batch) -> torch.Tensor:
    """[B, T] float mask of the tokens the loss sees: ``loss_mask`` times ``sample_mask`` (if present)."""
    mask = batch["loss_mask"].float()
    if "sample_mask" in batch:
        mask = mask * batch["sample_mask"].float().unsqueeze(1)
    return mask


def make_normalizer(batch: Batch) -> Normalizer:
    """Global denominators of ``batch``: valid tokens and sequences with at least one valid token."""
    mask = loss_token_mask(batch)
    return Normalizer(
        num_valid_tokens=float(mask.sum().item()),
        num_valid_sequences=float((mask.sum(dim=1) > 0).sum().item()),
    )


def broadcast_to_tokens(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A per-sample ``[B]`` tensor repeated over tokens (``[B, T]`` is returned as is)."""
    if values.dim() == 1:
        return values.unsqueeze(1).expand_as(like)
    if values.shape != like.shape:
        raise ValueError(f"expected a [B] or [B, T] tensor shaped like {tuple(like.shape)}, got {tuple(values.shape)}")
    return values


def reduce_loss(per_token: torch.Tensor, mask: torch.Tensor, normalizer: Normalizer, reduction: Reduction,
                constant_normalizer: float | None = None) -> torch.Tensor:
    """Scalar loss of ``per_token`` [B, T] over ``mask`` [B, T].

    ``token``: sum of masked values / global valid tokens.
    ``sequence``: each sequence's mean over its own masked tokens, summed / global valid sequences.
    ``constant`` (Dr. GRPO): sum of masked values / (global valid sequences x ``constant_normalizer``),
    a fixed length (e.g. the max response length), so no sample's tokens weigh more for being short.
    """
    if reduction == "token":
        return (per_token * mask).sum() / max(normalizer.num_valid_tokens, 1.0)
    if reduction == "sequence":
        per_sequence = (per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)  # [B]
        return per_sequence.sum() / max(normalizer.num_valid_sequences, 1.0)
    if reduction == "constant":
        if constant_normalizer is None or constant_normalizer <= 0:
            raise ValueError(f"reduction 'constant' needs a constant_normalizer > 0 (a length in tokens), "
                             f"got {constant_normalizer!r}")
        return (per_token * mask).sum() / (max(normalizer.num_valid_sequences, 1.0) * constant_normalizer)
    raise ValueError(f"unknown reduction {reduction!r}; use 'token', 'sequence' or 'constant'")


def token_mean_contribution(values: torch.Tensor, mask: torch.Tensor, normalizer: Normalizer) -> float:
    """This micro-batch's share of the global masked token mean of ``values`` (a metric)."""
    return float((values.detach().float() * mask).sum().item() / max(normalizer.num_valid_tokens, 1.0))


def sequence_mean_contribution(values: torch.Tensor, normalizer: Normalizer) -> float:
    """This micro-batch's share of the global mean of per-sequence ``values`` [B] (already 0 where invalid)."""
    return float(values.detach().float().sum().item() / max(normalizer.num_valid_sequences, 1.0))
