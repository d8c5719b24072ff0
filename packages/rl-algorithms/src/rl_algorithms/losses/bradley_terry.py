"""Bradley-Terry loss of a reward model on scalar scores.

``L = -log sigmoid(s_chosen - s_rejected)`` averaged over the pairs of the GLOBAL batch
(``normalizer.num_valid_sequences / 2``), plus an optional ``score_regularization * (s_chosen +
s_rejected)^2`` that keeps scores centred near 0 (TRL's ``center_rewards_coefficient``).

Scores come from ``ModelOutputs.scores`` [B] (a training backend with ``task: reward_model``). Rows are
interleaved pairs as in :func:`rl_algorithms.data.collate_pairs` (``is_chosen`` [B]).
Metrics (averages over pairs): ``accuracy`` (s_chosen > s_rejected), ``score_chosen``,
``score_rejected``, ``score_margin``, ``bt_loss``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rl_algorithms.data.collate import split_pairs
from rl_algorithms.losses.dpo import num_pairs
from rl_core.batch import Batch
from rl_core.types import ModelOutputs, Normalizer


@dataclass
class BradleyTerryLoss:
    """Pairwise reward-model loss; a picklable :class:`~rl_core.protocols.LossFn`."""

    score_regularization: float = 0.0
    """Coefficient of ``(s_chosen + s_rejected)^2`` (0: off)."""

    needs_logits = False

    def __post_init__(self) -> None:
        if self.score_regularization < 0:
            raise ValueError(f"score_regularization must be >= 0, got {self.score_regularization}")

    def __call__(self, outputs: ModelOutputs, batch: Batch, normalizer: Normalizer) -> tuple[torch.Tensor, dict[str, float]]:
        if outputs.scores is None:
            raise ValueError("the Bradley-Terry loss needs ModelOutputs.scores: train with policy.task=reward_model")
        chosen, rejected = split_pairs(batch)
        scores = outputs.scores.float().reshape(-1)  # [B]
        margin = scores[chosen] - scores[rejected]  # [P]
        pairs = num_pairs(normalizer)
        bt_loss = -F.logsigmoid(margin).sum() / pairs
        loss = bt_loss
        if self.score_regularization > 0:
            loss = loss + self.score_regularization * ((scores[chosen] + scores[rejected]) ** 2).sum() / pairs

        def per_pair(values: torch.Tensor) -> float:
            return float(values.detach().float().sum().item() / pairs)

        metrics = {
            "bt_loss": float(bt_loss.item()),
            "accuracy": per_pair(margin > 0),
            "score_chosen": per_pair(scores[chosen]),
            "score_rejected": per_pair(scores[rejected]),
            "score_margin": per_pair(margin),
        }
        return loss, metrics
