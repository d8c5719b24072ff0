"""The driver side of the DTensor backend."""

from __future__ import annotations

from rl_backends_train.dtensor.worker import DTensorWorker
from rl_backends_train.fp8 import check_before_start
from rl_backends_train.policy import TrainPolicy


class DTensorPolicy(TrainPolicy):
    """A model sharded over ``cfg.num_workers`` ranks (data parallel x tensor parallel, FSDP2)."""

    worker_cls = DTensorWorker

    @classmethod
    def check(cls, cfg, model_path: str) -> None:
        if cfg.precision.linear == "fp8":
            check_before_start(cfg)  # fail in the driver: the extra, a recipe this device cannot run
