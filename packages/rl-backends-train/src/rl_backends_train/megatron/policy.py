"""The driver side of the Megatron-core backend."""

from __future__ import annotations

from rl_backends_train.megatron import fp8
from rl_backends_train.megatron.worker import MegatronWorker, check_megatron_config, check_model_fits
from rl_backends_train.policy import TrainPolicy


class MegatronPolicy(TrainPolicy):
    """A megatron-core GPTModel sharded over ranks (tensor x context x data parallel x pipeline stages)."""

    worker_cls = MegatronWorker

    @classmethod
    def check(cls, cfg, model_path: str) -> None:
        check_megatron_config(cfg)
        fp8.check_before_start(cfg)  # Transformer Engine importable, GPU ranks
        check_model_fits(cfg, model_path)

    def generation_backend(self, cfg):
        """``generation.backend: megatron``: a GenerationBackend decoding on these workers' own model
        (``megatron/generation.py``), from the ``generation:`` section (``rl_backends_gen.GenerationConfig``)."""
        from rl_backends_train.megatron.generation import MegatronGeneration, check_generation_config

        check_generation_config(self.cfg, dtype=cfg.dtype, num_replicas=cfg.num_replicas)
        return MegatronGeneration(self, max_batch_size=cfg.max_batch_size, max_seq_len=cfg.max_seq_len, seed=cfg.seed)

    def load_adapter(self, path: str) -> None:
        """Replace the LoRA adapters by a PEFT-format adapter directory (``save_adapter``'s files, from
        either backend) whose rank, alpha and target modules equal ``policy.lora``."""
        self._run_all("load_adapter", str(path))
