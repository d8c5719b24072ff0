"""Data-parallel generation: N replicas of one backend in Ray actors, behind the same interface.

Prompts are split into contiguous slices, one per replica. Replica r receives its slice with the
base seed shifted by the slice's start, so sample j of prompt i still uses ``(seed + i, j)``: the
output does not depend on the number of replicas (for the native engine).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from rl_backends_gen.config import GenerationConfig
from rl_backends_gen.weights import chunk_named_tensors
from rl_core.types import Completion, SamplingParams


class GenerationReplica:
    """What each actor holds: one in-process backend built from the config."""

    def __init__(self, cfg: dict, model_path: str):
        from rl_backends_gen.local import build_local_backend

        self.backend = build_local_backend(GenerationConfig.model_validate(cfg), model_path)

    def generate(self, prompts, sampling: SamplingParams) -> list[list[Completion]]:
        return self.backend.generate(prompts, sampling)

    # Refit arrives in buckets. An engine that must see one refit as a whole (vLLM rebuilds a layer
    # only once all its weights arrived) has begin/load/finish methods; the others load each bucket
    # as a complete update_weights call.

    def begin_weight_update(self) -> None:
        if hasattr(self.backend, "begin_weight_update"):
            self.backend.begin_weight_update()

    def load_weight_bucket(self, bucket) -> None:
        import ray

        if isinstance(bucket, ray.ObjectRef):
            bucket = ray.get(bucket)
        getattr(self.backend, "load_weight_bucket", self.backend.update_weights)(bucket)

    def finish_weight_update(self) -> None:
        if hasattr(self.backend, "finish_weight_update"):
            self.backend.finish_weight_update()

    def sleep(self) -> None:
        self.backend.sleep()

    def wake(self) -> None:
        self.backend.wake()

    def shutdown(self) -> None:
        self.backend.shutdown()


class RayGenerationGroup:
    """A ``GenerationBackend`` that fans out over ``cfg.num_replicas`` Ray actors."""

    def __init__(self, cfg: GenerationConfig, model_path: str):
        from rl_core.cluster import WorkerGroup

        if cfg.num_replicas < 1:
            raise ValueError(f"RayGenerationGroup needs generation.num_replicas >= 1, got {cfg.num_replicas}")
        self.cfg = cfg
        self._seed_generator = torch.Generator().manual_seed(cfg.seed) if cfg.seed is not None else None
        self.group = WorkerGroup(
            GenerationReplica, cfg.num_replicas, init_kwargs=dict(cfg=cfg.model_dump(), model_path=model_path),
            cpus_per_worker=cfg.cpus_per_replica, gpus_per_worker=cfg.gpus_per_replica, name="generation",
        )

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[list[Completion]]:
        from rl_backends_gen.requests import validate_sampling

        validate_sampling(sampling)  # fail here, before any replica starts working
        prompts = [p.tolist() if isinstance(p, torch.Tensor) else list(p) for p in prompts]
        if not prompts:
            return []
        base_seed = sampling.seed if sampling.seed is not None else self._draw_seed()
        slices = _split(len(prompts), self.group.world_size)
        args = []
        for start, end in slices:
            replica_sampling = _with_seed(sampling, base_seed + start)
            args.append((prompts[start:end], replica_sampling))
        results = self.group.run_all_per_rank("generate", args)
        return [completions for part in results for completions in part]

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """One refit session on every replica: buckets of ``cfg.refit_bucket_bytes`` (one ``ray.put``
        each, cast to the engine dtype), so the driver holds one bucket at a time."""
        import ray

        self.group.run_all("begin_weight_update")
        for bucket in chunk_named_tensors(named_tensors, self.cfg.refit_bucket_bytes, dtype=self.cfg.dtype):
            self.group.run_all("load_weight_bucket", ray.put(bucket))
        self.group.run_all("finish_weight_update")

    def sleep(self) -> None:
        self.group.run_all("sleep")

    def wake(self) -> None:
        self.group.run_all("wake")

    def shutdown(self) -> None:
        self.group.shutdown()

    def _draw_seed(self) -> int:
        from rl_backends_gen.native.sampling import fresh_base_seed

        if self._seed_generator is None:
            return fresh_base_seed()
        return int(torch.randint(0, 2**62, (1,), generator=self._seed_generator))


def _split(count: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous slices of ``range(count)``, sizes differing by at most one (some may be empty)."""
    base, extra = divmod(count, parts)
    slices, start = [], 0
    for part in range(parts):
        end = start + base + (1 if part < extra else 0)
        slices.append((start, end))
        start = end
    return slices


def _with_seed(sampling: SamplingParams, seed: int) -> SamplingParams:
    import dataclasses

    return dataclasses.replace(sampling, seed=seed)
