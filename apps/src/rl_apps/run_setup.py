"""Run setup shared by the supervised commands (sft, dpo, rm, distill, xtoken-distill): model and
tokenizer resolution, dataset files (given or synthetic) and their loading, the metrics logger and
checkpointer of a run, the training backend (on Ray when configured), the final HF export, and the
one-line failure report."""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from rl_algorithms.checkpointing import CheckpointManager
from rl_algorithms.data import DataFileConfig, Loaded, LoadReport, SyntheticDataConfig, write_synthetic_dataset
from rl_backends_train import TrainBackendConfig, build_training_backend
from rl_core.cluster import ClusterConfig, init_ray
from rl_core.logging import MetricsLogger
from rl_core.models import resolve_model

T = TypeVar("T")



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


def load_splits(data: DataFileConfig, synthetic: SyntheticDataConfig | None, kind: str, out: Path,
                load: Callable[[str], Loaded[T]]) -> tuple[Loaded[T], Loaded[T] | None]:
    """``(train, validation or None)`` loaded with ``load(path)`` from :func:`dataset_paths`'s files;
    the load reports go to stderr. Raises ``rl_algorithms.data.DataError`` on a bad file."""
    train_path, val_path = dataset_paths(data, synthetic, kind, out)
    train = load(train_path)
    val = load(val_path) if val_path else None
    report_loaded(train.report, val.report if val else None)
    return train, val


def items(loaded: Loaded[Any] | None) -> list | None:
    """The rows of an optional split."""
    return loaded.items if loaded is not None else None
