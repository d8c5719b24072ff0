"""The SFT loop's config (``sft:`` in recipes)."""

from __future__ import annotations

from pydantic import Field

from rl_algorithms.losses.masking import Reduction
from rl_algorithms.losses.nll import NLLLoss
from rl_algorithms.supervised import SupervisedLoopConfig
from rl_core.config import StrictModel


class NLLLossConfig(StrictModel):
    """The masked NLL on the trained (assistant) tokens."""

    reduction: Reduction = "token"
    """``token``: mean NLL over every trained token of the batch. ``sequence``: mean of per-sample means."""

    def build(self) -> NLLLoss:
        return NLLLoss(reduction=self.reduction)


class SFTConfig(SupervisedLoopConfig):
    """Supervised fine-tuning: masked NLL on the assistant tokens of chat or prompt/response data."""

    batch_size: int = Field(8, gt=0)
    """Samples per optimizer step (micro-batched inside the training backend)."""
    val_batch_size: int = Field(16, gt=0)
    """Samples per forward pass during validation."""
    loss: NLLLossConfig = Field(default_factory=NLLLossConfig)
