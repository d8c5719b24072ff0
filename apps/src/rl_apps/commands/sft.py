"""``rl sft``: supervised fine-tuning (full or LoRA) on chat or prompt/response data.

Also home of the small run helpers the other supervised commands (dpo, rm, distill, xtoken-distill)
share: model resolution, dataset paths (files or ``synthetic_data``), logger + checkpointer, the policy
backend, and the final HF export.
"""

from __future__ import annotations

import logging
import sys
from contextlib import contextmanager
from pathlib import Path

from pydantic import Field

from rl_algorithms.checkpointing import CheckpointConfig, CheckpointManager
from rl_algorithms.data import (
    ChatDataConfig,
    DataError,
    DataFileConfig,
    LoadReport,
    SyntheticDataConfig,
    load_chat_dataset,
    pad_token_id_of,
    write_synthetic_dataset,
)
from rl_algorithms.sft import SFTConfig, sft_train
from rl_apps import recipe_path
from rl_backends_train import TrainBackendConfig, build_training_backend
from rl_core.cluster import ClusterConfig, init_ray
from rl_core.config import StrictModel
from rl_core.logging import LoggerConfig, MetricsLogger
from rl_core.models import resolve_model
from rl_core.seed import set_seed

log = logging.getLogger(__name__)


class SFTRunConfig(StrictModel):
    """Everything ``rl sft`` needs."""

    model: str = "tiny-llama"
    """A model name (``smollm2-135m-instruct``, ``tiny-llama``, ``tiny-qwen2``) or a local HF directory."""
    output_dir: str = "runs/sft"
    """Metrics, checkpoints (``checkpoints/``), the final HF model (``hf/``) and LoRA adapter (``adapter/``)."""
    seed: int = 0
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    policy: TrainBackendConfig = Field(default_factory=TrainBackendConfig)
    """The trained model's backend (``policy.lora`` for LoRA)."""
    data: ChatDataConfig = Field(default_factory=ChatDataConfig)
    synthetic_data: SyntheticDataConfig | None = None
    """Generate a memorisable arithmetic dataset into ``<output_dir>/data`` instead of reading ``data.train_path``."""
    sft: SFTConfig = Field(default_factory=SFTConfig)
    logger: LoggerConfig = Field(default_factory=LoggerConfig)
    checkpointing: CheckpointConfig = Field(default_factory=CheckpointConfig)
    export_hf: bool = True
    """Write the final model as an HF directory to ``<output_dir>/hf`` (LoRA: merged, plus ``adapter/``)."""


CONFIG_CLASS = SFTRunConfig
DEFAULT_RECIPE = recipe_path("sft_tiny.yaml")


def run(cfg: SFTRunConfig) -> int:
    set_seed(cfg.seed)
    out = Path(cfg.output_dir)
    model_path, tokenizer = resolve_with_tokenizer(cfg.model)
    try:
        train_path, val_path = dataset_paths(cfg.data, cfg.synthetic_data, "sft", out)
        train = load_chat_dataset(train_path, cfg.data, tokenizer)
        val = load_chat_dataset(val_path, cfg.data, tokenizer) if val_path else None
    except DataError as e:
        return fail("sft", e)
    report_loaded(train.report, val.report if val else None)

    policy_cfg = cfg.policy.model_copy(update={"reference_model": False})
    with open_run(cfg, out, cfg.sft.max_steps) as (logger, checkpointer):
        policy = build_backend(policy_cfg, model_path, cfg.cluster, seed=cfg.seed)
        try:
            sft_train(cfg.sft, policy, train.items, pad_token_id=pad_token_id_of(tokenizer),
                      val_data=val.items if val else None, logger=logger, checkpointer=checkpointer, seed=cfg.seed)
            if cfg.export_hf:
                export(policy, out, lora=cfg.policy.lora is not None)
        finally:
            policy.shutdown()
    return 0


# ------------------------------------------------------------------------------- shared helpers


def resolve_with_tokenizer(model: str):
    """``(local HF directory, its tokenizer)``."""
    from transformers import AutoTokenizer

    model_path = resolve_model(model)
    return model_path, AutoTokenizer.from_pretrained(model_path)


def dataset_paths(data: DataFileConfig, synthetic: SyntheticDataConfig | None, kind: str,
                  out: Path) -> tuple[str | None, str | None]:
    """``(train, validation)`` files: generated into ``<out>/data`` when ``synthetic`` is set, else from ``data``."""
    if synthetic is not None:
        return write_synthetic_dataset(kind, synthetic, out / "data")
    return data.train_path, data.validation_path


def report_loaded(train: LoadReport, val: LoadReport | None) -> None:
    for report in (train, val):
        if report is None:
            continue
        print(f"{report.path}: {report.num_kept} rows used, {report.num_skipped} bad rows skipped", file=sys.stderr)
        for reason in report.skipped_reasons:
            print(f"  skipped {reason}", file=sys.stderr)


@contextmanager
def open_run(cfg, out: Path, total_steps: int):
    """``(MetricsLogger, CheckpointManager)`` of a run in ``out``; the logger is closed at the end."""
    out.mkdir(parents=True, exist_ok=True)
    checkpointer = CheckpointManager(cfg.checkpointing, cfg.checkpointing.dir or out / "checkpoints")
    logger = MetricsLogger(cfg.logger, out, total_steps=total_steps, hparams=cfg.model_dump(mode="json"))
    try:
        yield logger, checkpointer
    finally:
        logger.close()


def build_backend(policy_cfg: TrainBackendConfig, model_path: str, cluster: ClusterConfig, *, seed: int,
                  name: str = "policy"):
    """A training backend; starts (or joins) Ray first when the backend runs on Ray."""
    if policy_cfg.use_ray:
        init_ray(cluster)
    return build_training_backend(policy_cfg, model_path, seed=seed, name=name)


def export(policy, out: Path, *, lora: bool) -> None:
    """The final model as an HF directory (``<out>/hf``) and, under LoRA, the adapter (``<out>/adapter``)."""
    policy.export_hf(str(out / "hf"))
    if lora and hasattr(policy, "save_adapter"):
        policy.save_adapter(str(out / "adapter"))


def fail(command: str, error: Exception) -> int:
    print(f"rl {command}: {error}", file=sys.stderr)
    return 1
