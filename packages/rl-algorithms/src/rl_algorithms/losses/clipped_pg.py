"""The clipped policy-gradient loss of the GRPO/PPO family, with its switches.

Per response token t, with ``r_t = exp(logpi_theta - logpi_old)`` and advantage ``A``:

* ``objective="clipped"``: ``L_t = max(-A r_t, -A clamp(r_t, 1 - eps_low, 1 + eps_high))``;
  with ``dual_clip = c``, where ``A < 0``: ``L_t = min(L_t, -A c)``.
* ``objective="reinforce"``: ``L_t = -A logpi_theta,t`` (no ratio).
* ``objective="cispo"``: ``L_t = -A sg(clamp(r_t, 1 - eps_low, 1 + eps_high)) logpi_theta,t``.
* ``ratio_level="sequence"`` (GSPO): ``r_t`` is replaced by the sequence ratio
  ``s_i = exp(mean_t (logpi_theta - logpi_old))`` of its sequence.

Then optionally: an importance weight (generation vs training, see :mod:`.importance_sampling`)
multiplies ``L_t``; ``kl_coef * KL_t`` to the reference policy is added; and ``positive_nll_coef *
(-logpi_theta,t)`` on samples with reward > 0. The policy and KL terms are reduced with the global
denominators of the :class:`~rl_core.types.Normalizer` (``reduction``), N valid tokens, S valid sequences:

* ``token``: ``sum_t L_t / N`` (DAPO, TRL's ``dapo``);
* ``sequence``: ``(1/S) sum_i mean_{t in i} L_t`` (GRPO as published, GSPO);
* ``constant`` (Dr. GRPO): ``sum_t L_t / (S * constant_normalizer)``, a fixed length. TRL's ``dr_grpo``
  divides the sum by ``batch rows x max_completion_length`` (then by the gradient-accumulation steps, so
  over an optimizer step: all rows of the step); here S counts the sequences with at least one valid
  token, so the two agree whenever no sample is masked out (environment error, overlong filtering).

The positive-sample NLL (VAPO) is ``sum over tokens of samples with reward > 0 of -logpi_theta,t``
divided by (``positive_nll_normalizer``) ``positive_tokens``: the number of those tokens in the
optimizer step, as VAPO's Eq. 10 and NeMo RL (which counts them per micro-batch; here they are counted
over the whole step, see :func:`with_positive_token_count`); or ``all_tokens``: reduced like the policy
term, so samples with reward <= 0 count in the denominator.

Batch keys: ``loss_mask`` [B, T], ``advantages`` [B] or [B, T], ``prev_logprobs`` [B, T] (when absent: this forward's
logprobs, detached, i.e. ratio 1 with the gradient of a single on-policy update), optional ``sample_mask`` [B]; ``gen_logprobs`` [B, T] (importance sampling and
mismatch metrics), ``ref_logprobs`` [B, T] (when ``kl_coef > 0``), ``rewards`` [B] (when
``positive_nll_coef > 0``), ``num_positive_tokens`` [B] (``positive_nll_normalizer="positive_tokens"``: the
optimizer step's count, the same in every row; :func:`with_positive_token_count` adds it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from rl_algorithms.losses.importance_sampling import ImportanceSampling, mismatch_per_token
from rl_algorithms.losses.kl import KLEstimator, kl_estimate
from rl_algorithms.losses.masking import (
    Reduction,
    broadcast_to_tokens,
    loss_token_mask,
    reduce_loss,
    token_mean_contribution,
)
from rl_core.batch import Batch
from rl_core.types import ModelOutputs, Normalizer

Objective = Literal["clipped", "reinforce", "cispo"]
PositiveNLLNormalizer = Literal["all_tokens", "positive_tokens"]
POSITIVE_TOKENS_KEY = "num_positive_tokens"


def with_positive_token_count(batch: Batch) -> Batch:
    """``batch`` (the rows of ONE optimizer step) with ``num_positive_tokens`` [B]: the number of valid
    tokens of its samples with reward > 0, repeated in every row so that any micro-batch or data-parallel
    shard of it carries the step's count (the denominator of the positive-sample NLL)."""
    positive = (batch["rewards"].float() > 0).float().unsqueeze(1)  # [B, 1]
    count = float((loss_token_mask(batch) * positive).sum().item())
    return {**batch, POSITIVE_TOKENS_KEY: torch.full((positive.shape[0],), count)}


@dataclass
class ClippedPolicyGradientLoss:
    """GRPO/DAPO policy loss; a picklable :class:`~rl_core.protocols.LossFn`."""

    ratio_clip_low: float = 0.2
    """eps_low: the ratio is clipped below at ``1 - ratio_clip_low``."""
    ratio_clip_high: float = 0.2
    """eps_high: the ratio is clipped above at ``1 + ratio_clip_high`` (DAPO clip-higher: 0.28)."""
    dual_clip: float | None = None
    """Dual-clip constant c > 1 bounding the loss of negative-advantage tokens at ``-A c`` (None: off)."""
    objective: Objective = "clipped"
    ratio_level: Literal["token", "sequence"] = "token"
    """``sequence``: GSPO's length-normalised sequence ratio."""
    reduction: Reduction = "token"
    constant_normalizer: float | None = None
    """The fixed length (tokens) of ``reduction="constant"`` (Dr. GRPO; TRL uses max_completion_length)."""
    kl_coef: float = 0.0
    """beta of the KL-to-reference term; 0 means no reference logprobs are needed."""
    kl_estimator: KLEstimator = "k3"
    importance_sampling: ImportanceSampling | None = None
    positive_nll_coef: float = 0.0
    """mu of an NLL term on samples whose reward is > 0 (0: off)."""
    positive_nll_normalizer: PositiveNLLNormalizer = "positive_tokens"
    """What the NLL term's sum is divided by: ``positive_tokens`` (VAPO, NeMo RL) or ``all_tokens``
    (reduced like the policy term)."""

    needs_logits = False  # class attribute, not a field: the protocol's flag

    def __post_init__(self) -> None:
        if self.ratio_clip_low < 0 or self.ratio_clip_high < 0:
            raise ValueError(f"ratio clip epsilons must be >= 0, got low={self.ratio_clip_low}, high={self.ratio_clip_high}")
        if self.ratio_clip_low > 1:
            raise ValueError(f"ratio_clip_low must be <= 1 (the ratio is clipped at 1 - eps; 1: no lower bound), "
                             f"got {self.ratio_clip_low}")
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise ValueError(f"dual_clip must be > 1 (or None), got {self.dual_clip}")
        if self.objective not in ("clipped", "reinforce", "cispo"):
            raise ValueError(f"objective must be 'clipped', 'reinforce' or 'cispo', got {self.objective!r}")
        if self.ratio_level not in ("token", "sequence"):
            raise ValueError(f"ratio_level must be 'token' or 'sequence', got {self.ratio_level!r}")
        if self.ratio_level == "sequence" and self.objective != "clipped":
            raise ValueError("the sequence-level (GSPO) ratio only applies to objective='clipped'")
        if self.dual_clip is not None and self.objective != "clipped":
            raise ValueError("dual_clip only applies to objective='clipped'")
        if self.reduction not in ("token", "sequence", "constant"):
            raise ValueError(f"reduction must be 'token', 'sequence' or 'constant', got {self.reduction!r}")
        if self.reduction == "constant" and (self.constant_normalizer is None or self.constant_normalizer <= 0):
            raise ValueError(f"reduction='constant' needs constant_normalizer > 0 (a length in tokens), "
                             f"got {self.constant_normalizer!r}")
        if self.positive_nll_normalizer not in ("all_tokens", "positive_tokens"):
            raise ValueError("positive_nll_normalizer must be 'all_tokens' or 'positive_tokens', "
                             f"got {self.positive_nll_normalizer!r}")
        if self.kl_coef < 0 or self.positive_nll_coef < 0:
            raise ValueError(f"kl_coef and positive_nll_coef must be >= 0, got {self.kl_coef}, {self.positive_nll_coef}")

    @property
    def needs_reference(self) -> bool:
        """Whether the batch must carry ``ref_logprobs``."""
        return self.kl_coef > 0

    @property
    def needs_positive_token_count(self) -> bool:
        """Whether each optimizer step's batch must carry ``num_positive_tokens`` (:func:`with_positive_token_count`)."""
        return self.positive_nll_coef > 0 and self.positive_nll_normalizer == "positive_tokens"

    def __call__(self, outputs: ModelOutputs, batch: Batch, normalizer: Normalizer) -> tuple[torch.Tensor, dict[str, float]]:
        logprobs = outputs.logprobs.float()  # [B, T]
        if "prev_logprobs" not in batch:
            # pi_old = this forward's own logprobs: exact when the batch gets one optimizer step.
            batch = {**batch, "prev_logprobs": logprobs.detach()}
        mask = loss_token_mask(batch)  # [B, T]
        advantages = broadcast_to_tokens(batch["advantages"].float(), logprobs)  # [B, T]
        metrics: dict[str, float] = {}

        per_token = self._policy_term(logprobs, batch, mask, advantages, normalizer, metrics)
        if self.importance_sampling is not None:
            weights, keep = self.importance_sampling(batch["prev_logprobs"], batch["gen_logprobs"], mask)
            per_token = per_token * weights * keep
            metrics["is_weight_mean"] = token_mean_contribution(weights, mask, normalizer)
            metrics["is_masked_fraction"] = token_mean_contribution(1 - keep, mask, normalizer)
        loss = self._reduce(per_token, mask, normalizer)
        metrics["pg_loss"] = float(loss.item())

        if "ref_logprobs" in batch:
            kl = kl_estimate(logprobs, batch["ref_logprobs"].float(), self.kl_estimator)
            metrics["kl"] = token_mean_contribution(kl, mask, normalizer)
            if self.kl_coef > 0:
                loss = loss + self.kl_coef * self._reduce(kl, mask, normalizer)
        elif self.kl_coef > 0:
            raise KeyError("kl_coef > 0 needs 'ref_logprobs' in the batch (reference logprobs were not computed)")

        if self.positive_nll_coef > 0:
            nll = self._positive_nll(logprobs, batch, mask, normalizer)
            metrics["positive_nll"] = float(nll.item())
            loss = loss + self.positive_nll_coef * nll

        if outputs.entropy is not None:
            metrics["entropy"] = token_mean_contribution(outputs.entropy, mask, normalizer)
        if "gen_logprobs" in batch and "prev_logprobs" in batch:
            for name, value in mismatch_per_token(batch["prev_logprobs"], batch["gen_logprobs"]).items():
                metrics[name] = token_mean_contribution(value, mask, normalizer)
        return loss, metrics

    def _reduce(self, per_token: torch.Tensor, mask: torch.Tensor, normalizer: Normalizer) -> torch.Tensor:
        return reduce_loss(per_token, mask, normalizer, self.reduction, self.constant_normalizer)

    def _positive_nll(self, logprobs: torch.Tensor, batch: Batch, mask: torch.Tensor,
                      normalizer: Normalizer) -> torch.Tensor:
        """This micro-batch's share of the NLL of the step's samples with reward > 0."""
        positive = (batch["rewards"].float() > 0).float().unsqueeze(1)  # [B, 1]
        if self.positive_nll_normalizer == "all_tokens":
            return self._reduce(-logprobs * positive, mask, normalizer)
        if POSITIVE_TOKENS_KEY not in batch:
            raise KeyError(f"positive_nll_normalizer='positive_tokens' needs '{POSITIVE_TOKENS_KEY}' in the batch: "
                           "pass each optimizer step's batch through with_positive_token_count()")
        count = float(batch[POSITIVE_TOKENS_KEY].max().item()) if batch[POSITIVE_TOKENS_KEY].numel() else 0.0
        return (-logprobs * positive * mask).sum() / max(count, 1.0)

    def _policy_term(
        self,
        logprobs: torch.Tensor,
        batch: Batch,
        mask: torch.Tensor,
        advantages: torch.Tensor,
        normalizer: Normalizer,
        metrics: dict[str, float],
    ) -> torch.Tensor:
        """[B, T] unreduced policy loss of the chosen objective (before importance weights)."""
        if self.objective == "reinforce":
            return -advantages * logprobs
        # Off the mask the log-ratio is forced to 0 so padding cannot overflow exp().
        log_ratio = torch.where(mask > 0, logprobs - batch["prev_logprobs"].float(), torch.zeros_like(logprobs))
        if self.ratio_level == "sequence":
            sequence_log_ratio = log_ratio.sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)  # [B]
            log_ratio = sequence_log_ratio.unsqueeze(1).expand_as(logprobs)
        ratio = torch.exp(log_ratio)
        clipped_ratio = ratio.clamp(1 - self.ratio_clip_low, 1 + self.ratio_clip_high)
        metrics["ratio_mean"] = token_mean_contribution(ratio, mask, normalizer)
        metrics["clip_fraction"] = token_mean_contribution((clipped_ratio != ratio).float(), mask, normalizer)
        if self.objective == "cispo":
            return -advantages * clipped_ratio.detach() * logprobs
        per_token = torch.maximum(-advantages * ratio, -advantages * clipped_ratio)
        if self.dual_clip is not None:
            bound = -advantages * self.dual_clip
            dual_clipped = (advantages < 0) & (per_token > bound)
            per_token = torch.where(advantages < 0, torch.minimum(per_token, bound), per_token)
            metrics["dual_clip_fraction"] = token_mean_contribution(dual_clipped.float(), mask, normalizer)
        return per_token
