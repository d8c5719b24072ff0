"""The DTensor backend: FSDP2 + tensor parallel over a Ray worker group (torch only)."""

from rl_backends_train.dtensor.policy import DTensorPolicy
from rl_backends_train.dtensor.worker import DTensorWorker

__all__ = ["DTensorPolicy", "DTensorWorker"]
