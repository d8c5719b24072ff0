"""The DPO loop's config (``dpo:`` in recipes)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rl_algorithms.losses.dpo import DPOLoss
from rl_algorithms.supervised import SupervisedLoopConfig
from rl_core.config import StrictModel


class DPOLossConfig(StrictModel):
    """The DPO loss (``dpo.loss``)."""

    beta: float = Field(0.1, gt=0.0)
    """Implicit KL strength; rewards are ``beta * (logpi - logpi_ref)`` summed (or averaged) over the response."""
    logprob_reduction: Literal["sum", "mean"] = "sum"
    """``sum``: as in the DPO paper. ``mean``: per-token mean (length-normalised)."""
    sft_coef: float = Field(0.0, ge=0.0)
    """Weight of an NLL term on the chosen responses (0: off)."""

    def build(self) -> DPOLoss:
        return DPOLoss(beta=self.beta, logprob_reduction=self.logprob_reduction, sft_coef=self.sft_coef)


class DPOConfig(SupervisedLoopConfig):
    """Direct preference optimisation against the frozen initial policy (or the LoRA base weights)."""

    batch_size: int = Field(8, gt=0)
    """Preference pairs per optimizer step (twice as many rows: chosen and rejected interleaved)."""
    loss: DPOLossConfig = Field(default_factory=DPOLossConfig)
