"""The driver side of a training backend: rl_core.protocols.TrainingBackend over a WorkerGroup of
``TrainWorker`` ranks (``worker.py``). A backend names its worker class and its driver-side checks."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from rl_backends_train.batching import rows_per_group
from rl_backends_train.config import TrainBackendConfig
from rl_backends_train.vision import check_vision_support
from rl_core.batch import Batch, batch_size, select
from rl_core.cluster import WorkerGroup
from rl_core.protocols import LossFn


class TrainPolicy:
    """A model sharded over ``cfg.num_workers`` ranks of ``worker_cls``."""

    worker_cls: type  # a TrainWorker subclass

    def __init__(self, cfg: TrainBackendConfig, model_path: str, *, seed: int = 0, name: str = "policy") -> None:
        check_vision_support(cfg, model_path)  # fail in the driver, before any worker starts
        self.check(cfg, model_path)
        self.cfg = cfg
        self.model_path = model_path
        self.group = WorkerGroup(
            self.worker_cls,
            cfg.num_workers,
            init_kwargs={"cfg": cfg, "model_path": model_path, "seed": seed},
            cpus_per_worker=cfg.cpus_per_worker,
            gpus_per_worker=cfg.gpus_per_worker,
            use_ray=cfg.use_ray,
            name=name,
        )
        self._offloaded = False

    @classmethod
    def check(cls, cfg: TrainBackendConfig, model_path: str) -> None:
        """Refuse what this backend cannot run (default: nothing beyond the config's own checks)."""

    # ------------------------------------------------------------------------ TrainingBackend

    def train(self, batch: Batch, loss_fn: LossFn, *, temperature: float = 1.0) -> dict[str, float]:
        """One optimizer step; returns the summed loss metrics plus loss, grad_norm and lr."""
        padded, _ = self._pad_for_dp(batch)
        return self._run_all("train", padded, loss_fn, temperature)[0]

    def logprobs(self, batch: Batch, *, temperature: float = 1.0, loss_tokens_only: bool = False) -> torch.Tensor:
        """[B, T] logprobs of ``batch['input_ids']`` under the current weights (``loss_tokens_only``: 0
        before the first column any row's ``loss_mask`` covers; that saves the LM head there)."""
        return self._gather_rows("logprobs", batch, temperature=temperature, loss_tokens_only=loss_tokens_only)

    def reference_logprobs(self, batch: Batch, *, temperature: float = 1.0,
                           loss_tokens_only: bool = False) -> torch.Tensor:
        """[B, T] logprobs under the frozen reference (initial weights, or the LoRA base)."""
        return self._gather_rows("logprobs", batch, temperature=temperature, reference=True,
                                 loss_tokens_only=loss_tokens_only)

    def topk_logits(self, batch: Batch, k: int, *, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """``(values [B, T, k], indices [B, T, k])`` of the temperature-scaled logits scoring each token."""
        padded, n = self._pad_for_dp(batch)
        parts = self._per_data_shard(self._run_all("topk_logits", padded, k, temperature))
        return torch.cat([p[0] for p in parts])[:n], torch.cat([p[1] for p in parts])[:n]

    def scores(self, batch: Batch) -> torch.Tensor:
        """[B] scalar scores (task='reward_model') at each sequence's last real token."""
        return self._gather_rows("scores", batch)

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full (unsharded, LoRA-merged) tensors in HF names, fetched from rank 0 bucket by bucket."""
        buckets = self._run_rank(0, "weight_buckets", self.cfg.weights_bucket_bytes)
        for names in buckets:
            yield from self._run_all("gather_weights", names)[0].items()

    def save(self, path: str) -> None:
        """DCP checkpoint (see rl_backends_train.checkpoint for the layout)."""
        self._run_all("save", str(path))

    def load(self, path: str) -> int:
        """Restore model, optimizer, schedulers, RNG states and step; returns the step."""
        return self._run_all("load", str(path))[0]

    def export_hf(self, path: str) -> None:
        """A consolidated HF directory (merged safetensors, config, tokenizer)."""
        self._run_all("export_hf", str(path))

    def save_adapter(self, path: str) -> None:
        """The LoRA adapter alone, in PEFT format."""
        self._run_all("save_adapter", str(path))

    def offload(self, *, weights: bool = False) -> None:
        """Free the policy's device memory until ``onload``: gradients freed, optimizer state (and with
        ``weights`` the parameters and the reference copy) moved to CPU memory, CUDA cache emptied.
        Any operation after it onloads first."""
        self.group.run_all("offload", weights)
        self._offloaded = True

    def onload(self) -> None:
        """Move back what ``offload`` moved (the next operation would do it otherwise)."""
        self.group.run_all("onload")
        self._offloaded = False

    def memory_metrics(self) -> dict[str, float]:
        """Memory in GiB of the rank that holds the most (each figure's maximum over ranks):
        ``cpu_rss_gib``; on CUDA ``gpu_allocated_gib``, ``gpu_reserved_gib`` and ``gpu_peak_gib`` (peak
        since the previous call: call it at the end of each phase)."""
        per_rank = self.group.run_all("memory_metrics")
        return {key: max(figures[key] for figures in per_rank) for key in per_rank[0]}

    def shutdown(self) -> None:
        self.group.shutdown()

    # ------------------------------------------------------------------------------- helpers

    def _run_all(self, method: str, *args, **kwargs) -> list:
        """``method`` on every rank, the offloaded state brought back first."""
        if self._offloaded:
            self.onload()
        return self.group.run_all(method, *args, **kwargs)

    def _run_rank(self, rank: int, method: str, *args, **kwargs):
        if self._offloaded:
            self.onload()
        return self.group.run_rank(rank, method, *args, **kwargs)

    def _gather_rows(self, method: str, batch: Batch, **kwargs) -> torch.Tensor:
        padded, n = self._pad_for_dp(batch)
        parts = self._per_data_shard(self._run_all(method, padded, **kwargs))
        return torch.cat(parts)[:n]

    def _per_data_shard(self, results: list) -> list:
        """One result per data shard: ranks ``dp_rank * tp * cp`` of the first pipeline stage (rank =
        tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank)); the ranks of a tensor- or
        context-parallel group hold the same rows, every stage returns the last stage's results)."""
        step = self.cfg.tensor_parallel_size * self.cfg.context_parallel_size
        return results[: self.cfg.data_parallel_size * step: step]

    def _pad_for_dp(self, batch: Batch) -> tuple[Batch, int]:
        """Append copies of the first rows (of the first pair, for preference batches) with nothing to
        score, so the rows split evenly over data shards without splitting a pair."""
        n = batch_size(batch)
        size = rows_per_group(batch)
        extra = -n % (self.cfg.data_parallel_size * size)
        if not extra:
            return batch, n
        filler = select(batch, [i % size for i in range(extra)])
        for key in ("loss_mask", "sample_mask"):
            if key in filler:
                filler[key] = torch.zeros_like(filler[key])
        return {k: torch.cat([batch[k], filler[k]]) for k in batch}, n

    def __enter__(self) -> TrainPolicy:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
