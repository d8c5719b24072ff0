"""The driver side of the Megatron-core backend (same operations as DTensorPolicy)."""

from __future__ import annotations

from rl_backends_train.dtensor.policy import DTensorPolicy
from rl_backends_train.megatron.worker import MegatronWorker, check_megatron_config, check_model_fits


class MegatronPolicy(DTensorPolicy):
    """A megatron-core GPTModel sharded over ranks (tensor x context x data parallel x pipeline stages)."""

    worker_cls = MegatronWorker

    def __init__(self, cfg, model_path: str, *, seed: int = 0, name: str = "policy") -> None:
        check_megatron_config(cfg)  # fail in the driver, before any worker starts
        check_model_fits(cfg, model_path)
        super().__init__(cfg, model_path, seed=seed, name=name)

    def load_adapter(self, path: str) -> None:
        """Replace the LoRA adapters by a PEFT-format adapter directory (``save_adapter``'s files, from
        either backend) whose rank, alpha and target modules equal ``policy.lora``."""
        self.group.run_all("load_adapter", str(path))

    def _per_data_shard(self, results: list) -> list:
        """One result per data shard: ranks ``dp_rank * tp * cp`` of the first stage (rank = tp_rank + tp *
        (cp_rank + cp * (dp_rank + dp * pp_rank)); every stage returns the last stage's results, every
        context-parallel rank the whole rows)."""
        step = self.cfg.tensor_parallel_size * self.cfg.context_parallel_size
        return results[: self.cfg.data_parallel_size * step: step]
