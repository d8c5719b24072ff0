"""KL divergence to a frozen reference policy, estimated on the sampled tokens.

With ``logr = clamp(logpi_ref - logpi_theta, -20, 20)``:
``k1 = -logr``, ``k2 = logr^2 / 2``, ``k3 = exp(logr) - 1 - logr``; the estimate is clamped to
[-10, 10] so a single wild token cannot dominate the step.
"""

from __future__ import annotations

from typing import Literal

import torch

KLEstimator = Literal["k1", "k2", "k3"]

LOG_RATIO_CLAMP = 20.0
KL_CLAMP = 10.0


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: KLEstimator = "k3") -> torch.Tensor:
    """[B, T] per-token estimate of KL(pi_theta || pi_ref); differentiable in ``logprobs``."""
    log_ratio = (ref_logprobs - logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    if estimator == "k1":
        kl = -log_ratio
    elif estimator == "k2":
        kl = log_ratio.square() / 2
    elif estimator == "k3":
        kl = torch.exp(log_ratio) - 1 - log_ratio
    else:
        raise ValueError(f"unknown KL estimator {estimator!r}; use 'k1', 'k2' or 'k3'")
    return kl.clamp(-KL_CLAMP, KL_CLAMP)


def kl_penalized_rewards(
    rewards: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    coef: float,
    estimator: KLEstimator = "k1",
) -> torch.Tensor:
    """KL in the reward instead of the loss: ``rewards [B] - coef * sum_t KL_t`` over each response.

    ``logprobs`` are the policy's logprobs at generation time (e.g. ``prev_logprobs``), ``mask`` the
    [B, T] response mask.
    """
    kl = kl_estimate(logprobs.detach().float(), ref_logprobs.float(), estimator)
    return rewards - coef * (kl * mask).sum(dim=1)
