"""Optional metric sinks: TensorBoard, Weights & Biases, MLflow. Each has ``log(metrics, step)`` and ``close()``.

Construction raises on a misconfiguration (a missing package); ``MetricsLogger`` guards the calls
afterwards so that a sink failing mid-run never stops training.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from rl_core.logging.config import MlflowConfig, WandbConfig


def require(package: str, extra: str, what: str, config_key: str) -> None:
    """Raise one clear ImportError when an enabled sink's package is missing."""
    if importlib.util.find_spec(package) is None:
        raise ImportError(
            f'Please install "rl-core[{extra}]" (or `pip install {package}`) to log to {what}, '
            f"or set {config_key}.enabled=false."
        )


class TensorBoardSink:
    def __init__(self, log_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, global_step=step)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


class WandbSink:
    def __init__(self, cfg: WandbConfig, run_dir: Path, hparams: dict[str, Any] | None):
        require("wandb", "wandb", "Weights & Biases", "logger.wandb")
        import wandb

        self.run = wandb.init(project=cfg.project, name=cfg.name, entity=cfg.entity, group=cfg.group,
                              tags=cfg.tags or None, mode=cfg.mode, dir=str(run_dir), config=hparams or {})

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowSink:
    def __init__(self, cfg: MlflowConfig, hparams: dict[str, Any] | None):
        require("mlflow", "mlflow", "MLflow", "logger.mlflow")
        import mlflow

        self.mlflow = mlflow
        if cfg.tracking_uri:
            mlflow.set_tracking_uri(cfg.tracking_uri)
        mlflow.set_experiment(cfg.experiment)
        self.run = mlflow.start_run(run_name=cfg.run_name)
        if hparams:
            mlflow.log_params(_flatten(hparams))

    def log(self, metrics: dict[str, float], step: int) -> None:
        # MLflow metric names may not contain some characters W&B allows; "/" is fine.
        self.mlflow.log_metrics(metrics, step=step)

    def close(self) -> None:
        self.mlflow.end_run()


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; MLflow params are flat and at most 500 characters."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = str(value)[:500]
    return flat
