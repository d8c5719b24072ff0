"""What a run logs, and where (the run directory itself is chosen by the caller)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rl_core.config.base import StrictModel


class WandbConfig(StrictModel):
    """Weights & Biases (needs ``pip install "rl-core[wandb]"``)."""

    enabled: bool = True
    """Log to W&B. The section may stay in a recipe with ``enabled: false``."""

    project: str = "rl"
    """W&B project."""

    name: str | None = None
    """Run name; None: W&B picks one."""

    entity: str | None = None
    """W&B team or user; None: your default."""

    group: str | None = None
    """Groups related runs in the W&B UI."""

    tags: list[str] = Field(default_factory=list)
    """Tags of the run."""

    mode: Literal["online", "offline", "disabled"] | None = None
    """None: W&B's own choice (the ``WANDB_MODE`` environment variable, else online); "offline"
    writes under the run directory and syncs later with ``wandb sync``."""


class MlflowConfig(StrictModel):
    """MLflow (needs ``pip install "rl-core[mlflow]"``)."""

    enabled: bool = True
    """Log to MLflow. The section may stay in a recipe with ``enabled: false``."""

    tracking_uri: str | None = None
    """MLflow tracking server or store (``http://host:5000``, ``sqlite:///path/mlflow.db``); None: the
    ``MLFLOW_TRACKING_URI`` environment variable when set, else ``sqlite:///<run_dir>/mlflow.db``
    (SQLAlchemy and alembic needed: the full ``mlflow`` package has them)."""

    experiment: str = "rl"
    """Experiment the run belongs to (created when missing)."""

    run_name: str | None = None
    """Run name; None: MLflow picks one."""


class LoggerConfig(StrictModel):
    """Metric logging of one run."""

    jsonl: bool = True
    """Append one JSON line per ``log()`` call to ``<run_dir>/metrics.jsonl`` (the record of truth)."""

    tensorboard: bool = True
    """Write TensorBoard scalars under ``<run_dir>/tensorboard``."""

    wandb: WandbConfig | None = None
    """Weights & Biases; None or ``enabled: false`` turns it off."""

    mlflow: MlflowConfig | None = None
    """MLflow; None or ``enabled: false`` turns it off."""

    stdout: bool = True
    """Print progress at all: the live bar, or one line per training step and per validation."""

    progress_bar: bool = True
    """On a terminal: a live bar over the steps with elapsed time, ETA and ``progress_keys``, each
    validation a line above it. Off by itself when stdout is not a terminal or ``CI`` is set (then,
    and with false, one plain line per training step and per validation)."""

    progress_keys: list[str] = Field(
        default_factory=lambda: ["train/reward_mean", "train/accuracy", "train/loss", "val/accuracy"]
    )
    """Metrics (full names, prefix included) shown in the bar or the per-step line, when present;
    validation lines show every ``val/`` metric."""

    plot: bool = True
    """On ``close()``, draw ``<run_dir>/metrics.png`` from the JSONL file (needs ``jsonl``)."""

    plot_keys: list[str] | None = None
    """Metrics to plot, one panel each; None: ``progress_keys`` plus every ``val/`` metric."""
