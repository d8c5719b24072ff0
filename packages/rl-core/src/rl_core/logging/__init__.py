"""Metrics of a run: JSONL (the record), TensorBoard, W&B, MLflow, a progress bar, PNG plots; phase timing."""

from rl_core.logging.config import LoggerConfig, MlflowConfig, WandbConfig
from rl_core.logging.jsonl import read_jsonl_metrics
from rl_core.logging.metrics_logger import MetricsLogger
from rl_core.logging.plot import plot_metrics
from rl_core.timer import Timer

__all__ = ["LoggerConfig", "MetricsLogger", "MlflowConfig", "Timer", "WandbConfig", "plot_metrics",
           "read_jsonl_metrics"]
