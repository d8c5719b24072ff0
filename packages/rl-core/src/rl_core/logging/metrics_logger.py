"""One object a training loop logs metrics to: JSONL, TensorBoard, W&B, MLflow, and the terminal."""

from __future__ import annotations

import json
import logging
import numbers
from pathlib import Path
from typing import Any

from rl_core.logging.config import LoggerConfig
from rl_core.logging.jsonl import JsonlWriter, cut_after_step
from rl_core.logging.plot import plot_metrics
from rl_core.logging.progress import ProgressDisplay

logger = logging.getLogger(__name__)

JSONL_NAME = "metrics.jsonl"
PLOT_NAME = "metrics.png"
SAMPLES_NAME = "samples.jsonl"
VALIDATION_NAME = "validation.jsonl"
PER_STEP_FILES = (JSONL_NAME, SAMPLES_NAME, VALIDATION_NAME)
"""The JSONL files of a run with one ``step`` per line: a resumed run cuts each back to its checkpoint."""


class MetricsLogger:
    """Logs ``{name: number}`` dicts at a step to every enabled sink.

    Construction raises for a misconfiguration (an enabled W&B/MLflow whose package is missing).
    Afterwards a failing sink is reported once and switched off: logging never stops a run.

    Args:
        cfg: what to log where.
        run_dir: directory of this run (created if missing); files go inside it.
        total_steps: length of the progress bar (None: a bar without a total).
        hparams: the resolved config, passed to TensorBoard (text and HParams), W&B (``config``) and
            MLflow (params).
        resume_from_step: the step of the checkpoint a resumed run starts from: see
            ``resume_from_step()``, called before anything is logged.
    """

    def __init__(self, cfg: LoggerConfig, run_dir: str | Path, total_steps: int | None = None,
                 hparams: dict[str, Any] | None = None, resume_from_step: int | None = None):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl_path = self.run_dir / JSONL_NAME
        self._sinks: dict[str, Any] = {}
        self._warned: set[str] = set()
        self._display: ProgressDisplay | None = None
        self._closed = False
        if cfg.plot and not cfg.jsonl:
            raise ValueError("logger.plot=true needs logger.jsonl=true (plots are drawn from metrics.jsonl)")
        try:
            self._open_sinks(hparams)
            if resume_from_step is not None:
                self.resume_from_step(resume_from_step)
        except BaseException:
            self.close(plot=False)
            raise
        if cfg.stdout:
            self._display = ProgressDisplay(total_steps, cfg.progress_keys, live=None if cfg.progress_bar else False)

    def _open_sinks(self, hparams: dict[str, Any] | None) -> None:
        from rl_core.logging.backends import MlflowSink, TensorBoardSink, WandbSink

        if self.cfg.jsonl:
            self._sinks["jsonl"] = JsonlWriter(self.jsonl_path)
        if self.cfg.tensorboard:
            self._sinks["tensorboard"] = TensorBoardSink(self.run_dir / "tensorboard", hparams, self.cfg.progress_keys)
        if self.cfg.wandb is not None and self.cfg.wandb.enabled:
            self._sinks["wandb"] = WandbSink(self.cfg.wandb, self.run_dir, hparams)
        if self.cfg.mlflow is not None and self.cfg.mlflow.enabled:
            self._sinks["mlflow"] = MlflowSink(self.cfg.mlflow, self.run_dir, hparams)

    def resume_from_step(self, step: int) -> None:
        """A run resumed from the checkpoint of ``step``: cut ``metrics.jsonl``, ``samples.jsonl`` and
        ``validation.jsonl`` back to it (lines of later steps dropped, the rest byte for byte, each file replaced
        atomically) and hide TensorBoard's later events, so that the files of the resumed run equal
        those of a run never interrupted. Call it before logging any step after ``step``. W&B and
        MLflow start a new run of their own."""
        jsonl = self._sinks.pop("jsonl", None)
        if jsonl is not None:
            jsonl.close()
        dropped = sum(cut_after_step(self.run_dir / name, step) for name in PER_STEP_FILES)
        if jsonl is not None:
            self._sinks["jsonl"] = JsonlWriter(self.jsonl_path)
        if "tensorboard" in self._sinks:
            self._sinks["tensorboard"].purge_after(step)
        if dropped:
            logger.info("resuming at step %d: dropped %d logged lines of later steps", step, dropped)

    def log(self, metrics: dict[str, Any], step: int, prefix: str = "train") -> dict[str, float]:
        """Log ``metrics`` at ``step`` as ``<prefix>/<name>`` (``prefix=""``: names as given).

        Values must be numbers (Python, NumPy or one-element tensors); others are skipped with a
        warning. ``step`` is a whole number (``3`` or ``3.0``); a metric named ``step`` is that step,
        not a metric, and is left out. Returns the logged dict."""
        if self._closed:
            raise RuntimeError("MetricsLogger.log() after close()")
        step = _whole(step)
        named = {f"{prefix}/{k}" if prefix else k: v for k, v in metrics.items() if k != "step"}
        scalars = self._to_floats(named)
        for name, sink in list(self._sinks.items()):
            self._guarded(name, sink.log, scalars, step)
        if self._display is not None:
            self._display.update(scalars, step)
        return scalars

    def log_samples(self, samples: list[dict[str, Any]], step: int) -> None:
        """Append example generations of ``step`` (JSON-serialisable dicts, e.g. prompt, response,
        reward) to ``<run_dir>/samples.jsonl``, one line each with ``step`` added."""
        self._append(SAMPLES_NAME, samples, step, "log_samples")

    def log_validation(self, record: dict[str, Any], step: int) -> None:
        """Append one evaluation's outcome per prompt at ``step`` (a JSON-serialisable dict, e.g. the
        split, which prompts were right, their answers) to ``<run_dir>/validation.jsonl`` as one line
        with ``step`` added: whether a fall in accuracy is the same prompts going wrong or others."""
        self._append(VALIDATION_NAME, [record], step, "log_validation")

    def _append(self, name: str, records: list[dict[str, Any]], step: int, method: str) -> None:
        if self._closed:
            raise RuntimeError(f"MetricsLogger.{method}() after close()")
        if not records:
            return

        step = _whole(step)

        def write() -> None:
            with open(self.run_dir / name, "a", encoding="utf-8") as f:
                for record in records:
                    f.write(json.dumps({"step": step, **record}, ensure_ascii=False, default=str) + "\n")

        self._guarded_call(name, write)

    def _guarded_call(self, name: str, fn) -> None:
        if name in self._warned:
            return
        try:
            fn()
        except OSError as e:
            self._warn_once(name, f"writing {name} failed ({e}); nothing more is written to it")

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
        if self._display is not None:
            self._display.close()
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


def _whole(step: Any) -> int:
    """The step as an int: JSONL files, TensorBoard and the plots count whole steps."""
    if isinstance(step, bool) or not isinstance(step, numbers.Real) or step != int(step):
        raise TypeError(f"a metrics step must be a whole number, got {step!r}")
    return int(step)
