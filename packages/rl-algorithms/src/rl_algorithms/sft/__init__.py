"""Supervised fine-tuning (full or LoRA, chosen by the training backend's config)."""

from rl_algorithms.sft.config import SFTConfig
from rl_algorithms.sft.loop import sft_train, validation_loss

__all__ = ["SFTConfig", "sft_train", "validation_loss"]
