"""Optional metric sinks: TensorBoard, Weights & Biases, MLflow. Each has ``log(metrics, step)`` and ``close()``.

Construction raises on a misconfiguration (a missing package); ``MetricsLogger`` guards the calls
afterwards so that a sink failing mid-run never stops training.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from pathlib import Path
from typing import Any

from rl_core.logging.config import MlflowConfig, WandbConfig


def require(package: str, extra: str, what: str, alternative: str) -> None:
    """Raise one clear ImportError when an enabled sink's package is missing."""
    if importlib.util.find_spec(package) is None:
        raise ImportError(f'Please install "rl-core[{extra}]" (or `pip install {package}`) to log to {what}, '
                          f"or {alternative}.")


class TensorBoardSink:
    """Scalars, and the run's config: as text (``config``, the YAML) and in the HParams tab (flattened
    ``a.b`` keys, with ``progress_keys`` as its metrics)."""

    def __init__(self, log_dir: Path, hparams: dict[str, Any] | None = None, metric_keys: list[str] = ()):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir))
        if hparams:
            self._log_config(hparams, list(metric_keys))

    def _log_config(self, hparams: dict[str, Any], metric_keys: list[str]) -> None:
        import yaml
        from torch.utils.tensorboard.summary import hparams as hparams_summary

        hparams = json.loads(json.dumps(hparams, default=str))  # plain values only (a Path becomes its text)
        text = yaml.safe_dump(hparams, sort_keys=False, default_flow_style=False)
        # Markdown: a code block keeps the YAML's indentation.
        self.writer.add_text("config", "\n".join("    " + line for line in text.splitlines()), global_step=0)
        flat = {k: v if isinstance(v, (bool, int, float, str)) else str(v) for k, v in _flatten(hparams, raw=True).items()}
        for summary in hparams_summary(flat, {key: math.nan for key in metric_keys}):
            self.writer.file_writer.add_summary(summary)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, global_step=step)

    def purge_after(self, step: int) -> None:
        """Hide the events of steps after ``step`` already in this directory (a resumed run writes them
        again): TensorBoard drops earlier events at or past a session start's step."""
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog

        self.writer.file_writer.add_event(Event(step=step + 1, session_log=SessionLog(status=SessionLog.START)))
        self.writer.flush()

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


class WandbSink:
    def __init__(self, cfg: WandbConfig, run_dir: Path, hparams: dict[str, Any] | None):
        require("wandb", "wandb", "Weights & Biases", "set logger.wandb.enabled=false")
        import wandb

        # mode=None leaves it to W&B: WANDB_MODE (e.g. offline) when set, else online.
        self.run = wandb.init(project=cfg.project, name=cfg.name, entity=cfg.entity, group=cfg.group,
                              tags=cfg.tags or None, mode=cfg.mode, dir=str(run_dir), config=hparams or {})

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowSink:
    def __init__(self, cfg: MlflowConfig, run_dir: Path, hparams: dict[str, Any] | None):
        require("mlflow", "mlflow", "MLflow", "set logger.mlflow.enabled=false")
        import mlflow

        self.mlflow = mlflow
        default_store = not cfg.tracking_uri and not os.environ.get("MLFLOW_TRACKING_URI")
        if default_store:
            # MLflow 3 refuses its old file store (./mlruns) unless MLFLOW_ALLOW_FILE_STORE=true, and
            # its own default, sqlite:///mlflow.db, lands in the working directory: a store of the run.
            for package in ("sqlalchemy", "alembic"):
                require(package, "mlflow", "MLflow's default store (sqlite in the run directory)",
                        "set logger.mlflow.tracking_uri")
            mlflow.set_tracking_uri(f"sqlite:///{Path(run_dir).resolve() / 'mlflow.db'}")
        elif cfg.tracking_uri:
            mlflow.set_tracking_uri(cfg.tracking_uri)
        if default_store and mlflow.get_experiment_by_name(cfg.experiment) is None:
            mlflow.create_experiment(cfg.experiment, artifact_location=(Path(run_dir).resolve() / "mlartifacts").as_uri())
        mlflow.set_experiment(cfg.experiment)
        self.run = mlflow.start_run(run_name=cfg.run_name)
        if hparams:
            mlflow.log_params(_flatten(hparams))

    def log(self, metrics: dict[str, float], step: int) -> None:
        # MLflow metric names may not contain some characters W&B allows; "/" is fine.
        self.mlflow.log_metrics(metrics, step=step)

    def close(self) -> None:
        self.mlflow.end_run()


def _flatten(tree: dict[str, Any], prefix: str = "", raw: bool = False) -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; values as strings of at most 500 characters (MLflow params are),
    or as they are with ``raw``."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{name}.", raw))
        else:
            flat[name] = value if raw else str(value)[:500]
    return flat
