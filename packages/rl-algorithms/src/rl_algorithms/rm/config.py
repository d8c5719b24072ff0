"""The reward-model loop's config (``rm:`` in recipes)."""

from __future__ import annotations

from pydantic import Field

from rl_algorithms.losses.bradley_terry import BradleyTerryLoss
from rl_core.config import StrictModel


class RMConfig(StrictModel):
    """Bradley-Terry training of a scalar head on an HF causal-LM backbone (backend ``task: reward_model``)."""

    max_steps: int = Field(100, gt=0)
    """Optimizer steps."""
    pairs_per_step: int = Field(8, gt=0)
    """Preference pairs per optimizer step (chosen and rejected rows interleaved)."""
    score_regularization: float = Field(0.0, ge=0.0)
    """Coefficient of ``(s_chosen + s_rejected)^2``, keeping scores centred (0: off)."""
    shuffle: bool = True
    val_every: int = Field(0, ge=0)
    """Validation (loss, accuracy, score margin) every N steps and after the last (0: never)."""
    val_at_start: bool = True
    val_pairs_per_batch: int = Field(8, gt=0)

    def build_loss(self) -> BradleyTerryLoss:
        return BradleyTerryLoss(score_regularization=self.score_regularization)
