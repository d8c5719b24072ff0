"""One object a training loop logs metrics to: JSONL, TensorBoard, W&B, MLflow, and the terminal."""

from __future__ import annotations

import json
import logging
import math
import numbers
import sys
from pathlib import Path
from typing import Any

from rl_core.logging.config import LoggerConfig
from rl_core.logging.jsonl import JsonlWriter
from rl_core.logging.plot import plot_metrics

logger = logging.getLogger(__name__)

JSONL_NAME = "metrics.jsonl"
PLOT_NAME = "metrics.png"
SAMPLES_NAME = "samples.jsonl"


class MetricsLogger:
    """Logs ``{name: number}`` dicts at a step to every enabled sink.

    Construction raises for a misconfiguration (an enabled W&B/MLflow whose package is missing).
    Afterwards a failing sink is reported once and switched off: logging never stops a run.

    Args:
        cfg: what to log where.
        run_dir: directory of this run (created if missing); files go inside it.
        total_steps: length of the progress bar (None: a bar without a total).
        hparams: the resolved config, passed to W&B (``config``) and MLflow (params) when enabled.
    """

    def __init__(self, cfg: LoggerConfig, run_dir: str | Path, total_steps: int | None = None,
                 hparams: dict[str, Any] | None = None):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl_path = self.run_dir / JSONL_NAME
        self._sinks: dict[str, Any] = {}
        self._warned: set[str] = set()
        self._bar = None
        self._closed = False
        if cfg.plot and not cfg.jsonl:
            raise ValueError("logger.plot=true needs logger.jsonl=true (plots are drawn from metrics.jsonl)")
        try:
            self._open_sinks(hparams)
        except BaseException:
            self.close(plot=False)
            raise
        if cfg.stdout and cfg.progress_bar:
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, file=sys.stdout, dynamic_ncols=True, desc="steps",
                             unit="step", smoothing=0.1)

    def _open_sinks(self, hparams: dict[str, Any] | None) -> None:
        from rl_core.logging.backends import MlflowSink, TensorBoardSink, WandbSink

        if self.cfg.jsonl:
            self._sinks["jsonl"] = JsonlWriter(self.jsonl_path)
        if self.cfg.tensorboard:
            self._sinks["tensorboard"] = TensorBoardSink(self.run_dir / "tensorboard")
        if self.cfg.wandb is not None and self.cfg.wandb.enabled:
            self._sinks["wandb"] = WandbSink(self.cfg.wandb, self.run_dir, hparams)
        if self.cfg.mlflow is not None and self.cfg.mlflow.enabled:
            self._sinks["mlflow"] = MlflowSink(self.cfg.mlflow, hparams)

    def log(self, metrics: dict[str, Any], step: int, prefix: str = "train") -> dict[str, float]:
        """Log ``metrics`` at ``step`` as ``<prefix>/<name>`` (``prefix=""``: names as given).

        Values must be numbers (Python, NumPy or one-element tensors); others are skipped with a
        warning. Returns the logged dict."""
        if self._closed:
            raise RuntimeError("MetricsLogger.log() after close()")
        named = {f"{prefix}/{k}" if prefix else k: v for k, v in metrics.items()}
        scalars = self._to_floats(named)
        for name, sink in list(self._sinks.items()):
            self._guarded(name, sink.log, scalars, step)
        self._show(scalars, step, prefix)
        return scalars

    def log_samples(self, samples: list[dict[str, Any]], step: int) -> None:
        """Append example generations of ``step`` (JSON-serialisable dicts, e.g. prompt, response,
        reward) to ``<run_dir>/samples.jsonl``, one line each with ``step`` added."""
        if self._closed:
            raise RuntimeError("MetricsLogger.log_samples() after close()")
        if not samples:
            return

        def write() -> None:
            with open(self.run_dir / SAMPLES_NAME, "a", encoding="utf-8") as f:
                for sample in samples:
                    f.write(json.dumps({"step": step, **sample}, ensure_ascii=False, default=str) + "\n")

        self._guarded_call("samples.jsonl", write)

    def _guarded_call(self, name: str, fn) -> None:
        if name in self._warned:
            return
        try:
            fn()
        except OSError as e:
            self._warn_once(name, f"writing {name} failed ({e}); no more samples are written")

    def _to_floats(self, metrics: dict[str, Any]) -> dict[str, float]:
        out = {}
        for key, value in metrics.items():
            try:
                if hasattr(value, "item") and getattr(value, "numel", lambda: 1)() == 1:
                    value = value.item()
                if not isinstance(value, numbers.Number) or isinstance(value, complex):
                    raise TypeError(type(value).__name__)
                out[key] = float(value)
            except (TypeError, ValueError) as e:
                self._warn_once(f"value:{key}", f"metric {key!r} is not a number ({e}); it is not logged")
        return out

    def _guarded(self, name: str, fn, *args) -> None:
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 - a sink must never stop the run
            logger.warning("logging to %s failed (%s: %s); %s is switched off for the rest of the run",
                           name, type(e).__name__, e, name)
            self._sinks.pop(name, None)

    def _show(self, scalars: dict[str, float], step: int, prefix: str) -> None:
        if not self.cfg.stdout:
            return
        # In the configured order; the prefix of this call is dropped from the names shown.
        shown = {k.removeprefix(f"{prefix}/") if prefix else k: scalars[k]
                 for k in self.cfg.progress_keys if k in scalars}
        text = " ".join(f"{k}={_fmt(v)}" for k, v in shown.items())
        if self._bar is None:
            if prefix == "train" or shown:
                print(f"step {step} [{prefix or 'metrics'}] {text}".rstrip(), flush=True)
            return
        if prefix == "train":
            if step > self._bar.n:
                self._bar.update(step - self._bar.n)
            self._bar.set_postfix_str(text, refresh=True)
        elif shown:
            self._bar.write(f"step {step} [{prefix}] {text}")

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message)

    def plot_keys(self) -> list[str]:
        """Metrics the closing plot draws: ``cfg.plot_keys`` or the progress keys plus every ``val/`` one."""
        if self.cfg.plot_keys is not None:
            return list(self.cfg.plot_keys)
        from rl_core.logging.jsonl import read_jsonl_metrics

        val_keys = sorted({k for r in read_jsonl_metrics(self.jsonl_path) for k in r if k.startswith("val/")})
        return list(dict.fromkeys([*self.cfg.progress_keys, *val_keys]))

    def close(self, plot: bool | None = None) -> Path | None:
        """Flush and close every sink and the bar; draw ``metrics.png`` (if enabled and there is data).
        Idempotent. Returns the plot's path, or None."""
        if self._closed:
            return None
        self._closed = True
        if self._bar is not None:
            self._bar.close()
        for name, sink in list(self._sinks.items()):
            self._guarded(name, sink.close)
        self._sinks.clear()
        if not (self.cfg.plot if plot is None else plot) or not self.jsonl_path.exists():
            return None
        try:
            return plot_metrics(self.jsonl_path, self.run_dir / PLOT_NAME, self.plot_keys())
        except Exception as e:  # noqa: BLE001 - a plot must never fail a finished run
            logger.warning("no metrics plot: %s", e)
            return None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _fmt(value: float) -> str:
    if math.isnan(value) or math.isinf(value):
        return str(value)
    return f"{value:.4g}"
