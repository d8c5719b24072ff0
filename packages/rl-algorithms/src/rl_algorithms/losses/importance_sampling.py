"""Correction for the mismatch between the generation engine and the trainer.

The samples come from ``pi_gen`` (the engine's logprobs, ``gen_logprobs``) but the loss treats them as
samples of ``pi_old`` (the trainer's logprobs before the update, ``prev_logprobs``). The importance
weight ``w = pi_old / pi_gen`` (detached) multiplies each token's loss:

* ``level="token"``: ``w_t = exp(logpi_old,t - logpi_gen,t)``;
* ``level="sequence"``: ``w_i = exp(sum_t (logpi_old - logpi_gen))``, the same for all tokens of i.

``truncation="clamp"`` (TIS) clamps ``w`` to ``[weight_min, weight_max]``; ``truncation="mask"``
(ICEPOP) zeroes the tokens (or sequences) whose ``w`` falls outside. Independently,
``seq_mask_low/high`` drop whole sequences whose geometric-mean ratio
``exp(mean_t (logpi_old - logpi_gen))`` is outside the bounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

# exp() above this would overflow float32; weights this large are clamped or masked anyway.
_MAX_LOG_WEIGHT = 80.0


@dataclass
class ImportanceSampling:
    """Importance-sampling correction between generation and training logprobs."""

    level: Literal["token", "sequence"] = "token"
    truncation: Literal["clamp", "mask", "none"] = "clamp"
    """``clamp`` (truncated IS), ``mask`` (ICEPOP: drop out-of-range weights) or ``none``."""
    weight_min: float = 0.0
    weight_max: float = 2.0
    seq_mask_low: float | None = None
    """Drop sequences whose geometric-mean ratio is below this (None: no lower bound)."""
    seq_mask_high: float | None = None
    """Drop sequences whose geometric-mean ratio is above this (None: no upper bound)."""

    def __post_init__(self) -> None:
        if self.level not in ("token", "sequence"):
            raise ValueError(f"importance sampling level must be 'token' or 'sequence', got {self.level!r}")
        if self.truncation not in ("clamp", "mask", "none"):
            raise ValueError(f"importance sampling truncation must be 'clamp', 'mask' or 'none', got {self.truncation!r}")
        if not (0.0 <= self.weight_min <= self.weight_max):
            raise ValueError(f"need 0 <= weight_min <= weight_max, got [{self.weight_min}, {self.weight_max}]")
        if self.seq_mask_low is not None and self.seq_mask_high is not None and self.seq_mask_low > self.seq_mask_high:
            raise ValueError(f"seq_mask_low {self.seq_mask_low} is above seq_mask_high {self.seq_mask_high}")

    def __call__(
        self, prev_logprobs: torch.Tensor, gen_logprobs: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(weights [B, T], keep [B, T])``, both detached floats; multiply both onto the token loss."""
        log_w = ((prev_logprobs - gen_logprobs).float() * mask).detach()  # [B, T], 0 off the mask
        if self.level == "sequence":
            log_w = log_w.sum(dim=1, keepdim=True).expand_as(mask)
        log_w = log_w.clamp(max=_MAX_LOG_WEIGHT)
        weights = torch.exp(log_w)
        keep = torch.ones_like(mask)
        if self.truncation == "clamp":
            weights = weights.clamp(self.weight_min, self.weight_max)
        elif self.truncation == "mask":
            inside = (weights >= self.weight_min) & (weights <= self.weight_max)
            keep = keep * inside.float()
        if self.seq_mask_low is not None or self.seq_mask_high is not None:
            keep = keep * self.sequence_keep(prev_logprobs, gen_logprobs, mask).unsqueeze(1)
        return weights, keep

    def sequence_keep(self, prev_logprobs: torch.Tensor, gen_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """[B] 1.0 for sequences whose geometric-mean ratio lies within ``[seq_mask_low, seq_mask_high]``."""
        mean_log_ratio = ((prev_logprobs - gen_logprobs).float() * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
        keep = torch.ones_like(mean_log_ratio, dtype=torch.bool)
        if self.seq_mask_low is not None:
            keep &= mean_log_ratio >= (math.log(self.seq_mask_low) if self.seq_mask_low > 0 else -math.inf)
        if self.seq_mask_high is not None:
            keep &= mean_log_ratio <= math.log(self.seq_mask_high)
        return keep.float()


def mismatch_per_token(prev_logprobs: torch.Tensor, gen_logprobs: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-token diagnostics of generation/training agreement ([B, T] each; average them over the mask).

    ``token_mult_prob_error = exp(|logpi_old - logpi_gen|)`` (1.0 is perfect);
    ``gen_kl_error`` = k3 estimate of KL(pi_gen || pi_old) on tokens sampled from pi_gen:
    ``r - 1 - log r`` with ``r = pi_old / pi_gen`` (>= 0, 0 is perfect).
    """
    diff = (prev_logprobs - gen_logprobs).float().detach().clamp(-20.0, 20.0)
    return {
        "token_mult_prob_error": torch.exp(diff.abs()),
        "gen_kl_error": torch.exp(diff) - 1 - diff,
    }


def mismatch_metrics(prev_logprobs: torch.Tensor, gen_logprobs: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Masked means of :func:`mismatch_per_token` over a whole batch, plus the max multiplicative error."""
    count = max(float(mask.sum().item()), 1.0)
    per_token = mismatch_per_token(prev_logprobs, gen_logprobs)
    out = {name: float((value * mask).sum().item() / count) for name, value in per_token.items()}
    mult = per_token["token_mult_prob_error"]
    out["token_mult_prob_error_max"] = float((mult * mask).max().item()) if mask.any() else 1.0
    return out
