"""The driver side of the Megatron-core backend (same operations as DTensorPolicy)."""

from __future__ import annotations

from rl_backends_train.dtensor.policy import DTensorPolicy
from rl_backends_train.megatron.worker import MegatronWorker, check_megatron_config


class MegatronPolicy(DTensorPolicy):
    """A megatron-core GPTModel sharded over ranks (tensor parallel x data parallel, pipeline 1)."""

    worker_cls = MegatronWorker

    def __init__(self, cfg, model_path: str, *, seed: int = 0, name: str = "policy") -> None:
        check_megatron_config(cfg)  # fail in the driver, before any worker starts
        super().__init__(cfg, model_path, seed=seed, name=name)

    def load_adapter(self, path: str) -> None:
        """Replace the LoRA adapters by a PEFT-format adapter directory (``save_adapter``'s files, from
        either backend) whose rank, alpha and target modules equal ``policy.training.lora``."""
        self.group.run_all("load_adapter", str(path))
