"""The DPO loop's config (``dpo:`` in recipes)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rl_algorithms.losses.dpo import DPOLoss
from rl_core.config import StrictModel


class DPOConfig(StrictModel):
    """Direct preference optimisation against the frozen initial policy (or the LoRA base weights)."""

    max_steps: int = Field(100, gt=0)
    """Optimizer steps."""
    pairs_per_step: int = Field(8, gt=0)
    """Preference pairs per optimizer step (twice as many rows: chosen and rejected interleaved)."""
    beta: float = Field(0.1, gt=0.0)
    """Implicit KL strength; rewards are ``beta * (logpi - logpi_ref)`` summed (or averaged) over the response."""
    logprob_reduction: Literal["sum", "mean"] = "sum"
    """``sum``: as in the DPO paper. ``mean``: per-token mean (length-normalised)."""
    sft_coef: float = Field(0.0, ge=0.0)
    """Weight of an NLL term on the chosen responses (0: off)."""
    shuffle: bool = True
    val_every: int = Field(0, ge=0)
    """Validation (loss, accuracy, rewards, margin) every N steps and after the last (0: never)."""
    val_at_start: bool = True
    val_pairs_per_batch: int = Field(8, gt=0)
    """Pairs per forward pass during validation."""

    def build_loss(self) -> DPOLoss:
        return DPOLoss(beta=self.beta, logprob_reduction=self.logprob_reduction, sft_coef=self.sft_coef)
