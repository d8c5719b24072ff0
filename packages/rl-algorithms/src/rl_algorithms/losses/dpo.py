"""Direct Preference Optimization.

Per pair, with ``rho = sum_t (logpi_theta,t - logpi_ref,t)`` over the response tokens (or the per-token
mean with ``logprob_reduction="mean"``)::

    L = -log sigmoid(beta (rho_chosen - rho_rejected)) + sft_coef * NLL(chosen)

where NLL(chosen) is the chosen response's mean per-token NLL. Both terms are averaged over the pairs of
the GLOBAL batch (``normalizer.num_valid_sequences / 2``), so micro-batch losses sum to the batch loss.

Batch layout (:func:`rl_algorithms.data.collate_pairs`): rows ``2i`` / ``2i + 1`` are the chosen /
rejected response of pair ``i`` (``is_chosen`` [B]); keys ``loss_mask`` [B, T] and ``ref_logprobs``
[B, T] (the frozen reference, from ``TrainingBackend.reference_logprobs``).

Metrics (averages over pairs): ``accuracy`` (rho_chosen > rho_rejected), ``reward_chosen`` and
``reward_rejected`` (beta * rho), ``reward_margin``, ``dpo_loss``, ``sft_nll``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from rl_algorithms.data.collate import split_pairs
from rl_algorithms.losses.masking import loss_token_mask
from rl_core.batch import Batch
from rl_core.types import ModelOutputs, Normalizer


def num_pairs(normalizer: Normalizer) -> float:
    """Pairs in the global batch: every row of a pair batch is a valid sequence."""
    return max(normalizer.num_valid_sequences / 2.0, 1.0)


@dataclass
class DPOLoss:
    """The DPO loss; a picklable :class:`~rl_core.protocols.LossFn`."""

    beta: float = 0.1
    """Strength of the implicit KL to the reference: rewards are ``beta * rho``."""
    logprob_reduction: Literal["sum", "mean"] = "sum"
    """``sum``: rho sums over response tokens (the DPO paper). ``mean``: per-token mean (length-normalised)."""
    sft_coef: float = 0.0
    """lambda of the NLL term on the chosen responses (0: off)."""

    needs_logits = False

    def __post_init__(self) -> None:
        if self.beta <= 0:
            raise ValueError(f"beta must be > 0, got {self.beta}")
        if self.logprob_reduction not in ("sum", "mean"):
            raise ValueError(f"logprob_reduction must be 'sum' or 'mean', got {self.logprob_reduction!r}")
        if self.sft_coef < 0:
            raise ValueError(f"sft_coef must be >= 0, got {self.sft_coef}")

    def __call__(self, outputs: ModelOutputs, batch: Batch, normalizer: Normalizer) -> tuple[torch.Tensor, dict[str, float]]:
        if "ref_logprobs" not in batch:
            raise KeyError("DPO needs 'ref_logprobs' in the batch (TrainingBackend.reference_logprobs)")
        chosen, rejected = split_pairs(batch)
        logprobs = outputs.logprobs.float()  # [B, T]
        mask = loss_token_mask(batch)  # [B, T]
        tokens = mask.sum(dim=1).clamp(min=1.0)  # [B]
        rho = ((logprobs - batch["ref_logprobs"].float()) * mask).sum(dim=1)  # [B]
        if self.logprob_reduction == "mean":
            rho = rho / tokens
        rewards = self.beta * rho  # [B]
        margin = rewards[chosen] - rewards[rejected]  # [P]
        pairs = num_pairs(normalizer)

        dpo_loss = -F.logsigmoid(margin).sum() / pairs
        chosen_nll = (-(logprobs * mask).sum(dim=1) / tokens)[chosen]  # [P]
        sft_nll = chosen_nll.sum() / pairs
        loss = dpo_loss + self.sft_coef * sft_nll if self.sft_coef > 0 else dpo_loss

        def per_pair(values: torch.Tensor) -> float:
            return float(values.detach().float().sum().item() / pairs)

        metrics = {
            "dpo_loss": float(dpo_loss.item()),
            "sft_nll": float(sft_nll.item()),
            "accuracy": per_pair(margin > 0),
            "reward_chosen": per_pair(rewards[chosen]),
            "reward_rejected": per_pair(rewards[rejected]),
            "reward_margin": per_pair(margin),
        }
        return loss, metrics
