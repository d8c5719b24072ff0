"""The reward-model loop's config (``rm:`` in recipes)."""

from __future__ import annotations

from pydantic import Field

from rl_algorithms.losses.bradley_terry import BradleyTerryLoss
from rl_algorithms.supervised import SupervisedLoopConfig
from rl_core.config import StrictModel


class BradleyTerryLossConfig(StrictModel):
    """The Bradley-Terry loss (``rm.loss``)."""

    score_regularization: float = Field(0.0, ge=0.0)
    """Coefficient of ``(s_chosen + s_rejected)^2``, keeping scores centred (0: off)."""

    def build(self) -> BradleyTerryLoss:
        return BradleyTerryLoss(score_regularization=self.score_regularization)


class RMConfig(SupervisedLoopConfig):
    """Bradley-Terry training of a scalar head on an HF causal-LM backbone (backend ``task: reward_model``)."""

    batch_size: int = Field(8, gt=0)
    """Preference pairs per optimizer step (chosen and rejected rows interleaved)."""
    loss: BradleyTerryLossConfig = Field(default_factory=BradleyTerryLossConfig)
