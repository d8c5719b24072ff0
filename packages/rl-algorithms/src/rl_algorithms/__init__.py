"""Losses, advantages, rollouts and training loops (GRPO, DAPO, GSPO, GDPO, SFT, DPO, RM, distillation)."""

__version__ = "0.1.0"
