"""Group-relative advantages (GRPO, Dr. GRPO, leave-one-out, GDPO, REINFORCE++ baseline).

Samples of the same prompt share a ``group_id``. ``valid`` [B] marks samples that take part (e.g. not
filtered as overlong, no environment error); invalid samples get advantage 0 and are left out of
their group's statistics. Groups with fewer than two valid samples get advantage 0: one sample
has nothing to be compared with.

Standard deviations are Bessel-corrected (divide by n - 1). Division by the std happens only where
the std is > 0: ``A /= std + eps``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import torch

Baseline = Literal["mean", "leave_one_out"]
EPS = 1e-6


def _group_index(group_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Dense group indices 0..num_groups-1 for arbitrary ``group_ids`` [B]."""
    _, inverse = torch.unique(group_ids, return_inverse=True)
    return inverse, int(inverse.max().item()) + 1 if inverse.numel() else 0


def group_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    valid: torch.Tensor | None = None,
    *,
    baseline: Baseline = "mean",
    normalize_std: bool = True,
    eps: float = EPS,
) -> torch.Tensor:
    """[B] advantages ``r_i - baseline_i`` (divided by the group std when ``normalize_std``).

    ``baseline="mean"``: the mean of the group's valid rewards; the std is the group's sample std.
    ``baseline="leave_one_out"``: the mean of the other valid rewards of the group, and the std of
    those others (Bessel-corrected; undefined, hence not divided, with fewer than 3 valid samples).
    ``normalize_std=False`` is Dr. GRPO.
    """
    rewards = rewards.double()
    valid = torch.ones_like(rewards, dtype=torch.bool) if valid is None else valid.bool()
    index, num_groups = _group_index(group_ids)
    w = valid.double()
    count = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, index, w)  # [G]
    total = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, index, rewards * w)
    total_sq = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, index, rewards.square() * w)
    n, s, s2 = count[index], total[index], total_sq[index]  # per sample [B]

    if baseline == "mean":
        mean = s / n.clamp(min=1)
        var = (s2 - n * mean.square()) / (n - 1).clamp(min=1)
    elif baseline == "leave_one_out":
        # Statistics of the group without sample i (a valid sample is removed from its own group).
        m = n - 1
        s_o, s2_o = s - rewards, s2 - rewards.square()
        mean = s_o / m.clamp(min=1)
        var = torch.where(m >= 2, (s2_o - m * mean.square()) / (m - 1).clamp(min=1), torch.zeros_like(s))
    else:
        raise ValueError(f"unknown baseline {baseline!r}; use 'mean' or 'leave_one_out'")

    advantages = rewards - mean
    if normalize_std:
        std = var.clamp(min=0).sqrt()
        # Tiny negative/positive float noise in var must not count as spread.
        has_spread = std > 1e-12
        advantages = torch.where(has_spread, advantages / (std + eps), advantages)
    advantages = torch.where(valid & (n >= 2), advantages, torch.zeros_like(advantages))
    return advantages.float()


def gdpo_advantages(
    components: Mapping[str, torch.Tensor],
    weights: Mapping[str, float],
    group_ids: torch.Tensor,
    valid: torch.Tensor | None = None,
    *,
    eps: float = EPS,
) -> torch.Tensor:
    """GDPO: normalise each reward component within its group (mean baseline, std), take the weighted
    sum, then renormalise over the valid samples of the batch to mean 0 and std 1 (Bessel)."""
    missing = set(weights) - set(components)
    if missing:
        raise KeyError(f"GDPO weights name reward components {sorted(missing)} that the environment did not return; "
                       f"it returned {sorted(components)}")
    if not weights:
        raise ValueError("GDPO needs at least one weighted reward component")
    first = next(iter(components.values()))
    valid = torch.ones_like(first, dtype=torch.bool) if valid is None else valid.bool()
    total = torch.zeros_like(first, dtype=torch.float64)
    for name, weight in weights.items():
        total += weight * group_advantages(components[name], group_ids, valid, baseline="mean", normalize_std=True, eps=eps).double()
    return whiten(total, valid.double(), eps=eps).float()


def reinforce_pp_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    token_mask: torch.Tensor,
    valid: torch.Tensor | None = None,
    *,
    eps: float = EPS,
) -> torch.Tensor:
    """REINFORCE++ with a group baseline: ``r_i - mean(group)``, broadcast to the response tokens and
    whitened over all valid tokens of the batch. Returns [B, T] (0 off the mask)."""
    valid = torch.ones_like(rewards, dtype=torch.bool) if valid is None else valid.bool()
    centred = group_advantages(rewards, group_ids, valid, baseline="mean", normalize_std=False).double()
    mask = token_mask.double() * valid.double().unsqueeze(1)  # [B, T]
    per_token = centred.unsqueeze(1).expand_as(mask)
    return (whiten(per_token, mask, eps=eps) * mask).float()


def whiten(values: torch.Tensor, mask: torch.Tensor, *, eps: float = EPS) -> torch.Tensor:
    """``(values - mean) / (std + eps)`` with mean and Bessel std over ``mask`` (0 where masked out).
    With fewer than two masked values, or no spread, only the mean is removed."""
    count = mask.sum()
    if count < 1:
        return torch.zeros_like(values)
    mean = (values * mask).sum() / count
    centred = (values - mean) * mask
    if count < 2:
        return centred
    std = (centred.square().sum() / (count - 1)).sqrt()
    return centred / (std + eps) if std > 1e-12 else centred


def clip_advantages(advantages: torch.Tensor, low: float | None, high: float | None) -> torch.Tensor:
    """Clamp advantages to ``[low, high]`` (None: unbounded on that side)."""
    if low is None and high is None:
        return advantages
    return advantages.clamp(min=low, max=high)
