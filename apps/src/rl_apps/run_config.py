"""The config sections every training command shares, and the checks that span them.

Each command's config subclasses :class:`RunConfig` (or :class:`SupervisedRunConfig`), adds its own
sections (``data``, the loop section named by ``LOOP_SECTION``, a teacher, a generation backend) and
overrides the defaults that differ (``output_dir``, ``model``).
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field, model_validator

from rl_algorithms.checkpointing import CheckpointConfig
from rl_algorithms.data import SyntheticDataConfig, write_synthetic_dataset
from rl_algorithms.loop import LoopConfig
from rl_backends_train import TrainBackendConfig
from rl_core.cluster import ClusterConfig
from rl_core.config import Seed, StrictModel
from rl_core.logging import LoggerConfig


class RunConfig(StrictModel):
    """What every training run has: the model, where its outputs go, the cluster, the policy's backend,
    metrics logging and checkpoints."""

    LOOP_SECTION: ClassVar[str] = ""
    """The key of the command's loop section (``grpo``, ``sft``, ...): a :class:`LoopConfig`."""

    model: str = "tiny-llama"
    """A model name (``smollm2-135m-instruct``, ``tiny-llama``, ``tiny-qwen2``) or a local HF directory."""
    output_dir: str = "runs/run"
    """Metrics, the resolved ``config.yaml``, checkpoints (``checkpoints/``) and the final HF model (``hf/``)."""
    seed: Seed = 0
    """Seeds the driver, the workers, the data order and every generation call (0 to 2**32 - 1)."""
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    """Ray, started once from this section when any part of the run uses it."""
    policy: TrainBackendConfig = Field(default_factory=TrainBackendConfig)
    """The trained model's backend (``policy.lora`` for LoRA)."""
    logger: LoggerConfig = Field(default_factory=LoggerConfig)
    checkpointing: CheckpointConfig = Field(default_factory=CheckpointConfig)
    export_hf: bool = True
    """Write the final model as an HF directory to ``<output_dir>/hf`` (LoRA: merged, plus ``adapter/``; a speculative
    draft trained online: ``draft/``)."""

    @model_validator(mode="after")
    def _router_replay_has_a_record(self) -> RunConfig:
        """policy.moe.router_replay replays what the run's own generation engine recorded."""
        if not self.policy.moe.router_replay:
            return self
        generation = getattr(self, "generation", None)
        if generation is None:
            raise ValueError(f"policy.moe.router_replay=true replays the experts a generation engine recorded, and the "
                             f"{self.LOOP_SECTION} loop generates nothing: set policy.moe.router_replay=false")
        if not generation.record_routing:
            raise ValueError("policy.moe.router_replay=true replays the experts the generation engine records: set "
                             "generation.record_routing=true (backend=native)")
        return self

    @property
    def loop(self) -> LoopConfig:
        """The command's loop section."""
        return getattr(self, self.LOOP_SECTION)

    def uses_ray(self) -> bool:
        """Whether any part of the run starts Ray actors (then Ray is started first, from ``cluster``)."""
        return self.policy.use_ray

    def write_run_data(self, folder: Path) -> None:
        """Write the data the run generates itself into ``folder`` (``<output_dir>/data``); none by default."""

    def run_data_files(self) -> list[str]:
        """The files ``write_run_data`` may write, relative to the output directory (a previous run's are
        what ``--overwrite`` removes there)."""
        return []


class SupervisedRunConfig(RunConfig):
    """A run over a fixed dataset (SFT, DPO, RM, distillation): its files, or a synthetic set."""

    SYNTHETIC_KIND: ClassVar[str] = ""
    """What ``synthetic_data`` generates for this command (see rl_algorithms.data.synthetic)."""

    synthetic_data: SyntheticDataConfig | None = None
    """Generate a small dataset (written to ``<output_dir>/data``) instead of reading ``data.train_path``."""

    def write_run_data(self, folder: Path) -> None:
        if self.synthetic_data is not None:
            write_synthetic_dataset(self.SYNTHETIC_KIND, self.synthetic_data, folder)

    def run_data_files(self) -> list[str]:
        # The names write_synthetic_dataset gives its files.
        return [f"data/{self.SYNTHETIC_KIND}_{split}.jsonl" for split in ("train", "val")]


class TeacherConfig(StrictModel):
    """The frozen teacher: a model and the backend it runs on (its optimizer is never stepped usefully: lr 0)."""

    model: str = "tiny-qwen2"
    """A model name or a local HF directory."""
    backend: TrainBackendConfig = Field(default_factory=TrainBackendConfig)
    """Sharding and dtype of the teacher; its optimizer, LoRA and reference settings are ignored."""

    def frozen_backend(self) -> TrainBackendConfig:
        optimizer = self.backend.optimizer.model_copy(update={"lr": 0.0})
        return self.backend.model_copy(update={"optimizer": optimizer, "lora": None, "reference_model": False,
                                               "task": "causal_lm"})


class TeacherRunConfig(SupervisedRunConfig):
    """A distillation run: a student (``model``, ``policy``) and a frozen teacher."""

    teacher: TeacherConfig = Field(default_factory=TeacherConfig)

    def uses_ray(self) -> bool:
        return super().uses_ray() or self.teacher.backend.use_ray


def check_pair_batching(policy: TrainBackendConfig, batch_size: int, section: str) -> None:
    """Pairs are interleaved rows (2i chosen, 2i+1 rejected): every split of the batch must keep them together."""
    if policy.packing.enabled or policy.dynamic_batching.enabled:
        raise ValueError("preference training needs policy.packing.enabled=false and "
                         "policy.dynamic_batching.enabled=false (they reorder rows and would split pairs)")
    if policy.micro_batch_size % 2:
        raise ValueError(f"policy.micro_batch_size must be even (pairs of rows), got {policy.micro_batch_size}")
    if batch_size % policy.data_parallel_size:
        raise ValueError(f"{section}.batch_size={batch_size} must be a multiple of the data-parallel size "
                         f"{policy.data_parallel_size}, so that no worker's shard splits a pair")
