"""The SFT loop's config (``sft:`` in recipes)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rl_core.config import StrictModel


class SFTConfig(StrictModel):
    """Supervised fine-tuning: masked NLL on the assistant tokens of chat or prompt/response data."""

    max_steps: int = Field(100, gt=0)
    """Optimizer steps."""
    batch_size: int = Field(8, gt=0)
    """Samples per optimizer step (micro-batched inside the training backend)."""
    loss_reduction: Literal["token", "sequence"] = "token"
    """``token``: mean NLL over every trained token of the batch. ``sequence``: mean of per-sample means."""
    shuffle: bool = True
    """Visit the training samples in a fresh seeded order each epoch."""
    val_every: int = Field(0, ge=0)
    """Validation loss every N steps and after the last step (0: never)."""
    val_at_start: bool = True
    """Also validate before the first step (when validating at all)."""
    val_batch_size: int = Field(16, gt=0)
    """Samples per forward pass during validation."""
