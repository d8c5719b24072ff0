"""The one training-loop skeleton of every algorithm (GRPO, SFT, DPO, reward model, distillation)::

    resume (weights, data position, RNG, history) -> validate before the first step
    for each step:  train_step -> validate when due -> record metrics -> checkpoint when due

An algorithm brings only its own step (``train_step(step, timer) -> metrics``, the phases timed in
``timer``) and, optionally, its validation (``validate(step) -> metrics``). Step metrics are logged as
``train/<name>`` (phase times as ``train/time/<phase>``), validation metrics as ``val/<name>``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from pydantic import Field

from rl_algorithms.checkpointing import CheckpointError, CheckpointManager
from rl_algorithms.draft import draft_files, restore_draft
from rl_core.config import StrictModel
from rl_core.protocols import GenerationBackend, TrainingBackend
from rl_core.timer import Timer

log = logging.getLogger(__name__)

Metrics = dict[str, float]
TrainStep = Callable[[int, Timer], Metrics]
"""``train_step(step, timer)``: one training step (0-based ``step``); returns its metrics, phase times in ``timer``."""
Validate = Callable[[int], Metrics]
"""``validate(step)``: held-out metrics after ``step`` completed steps (0: before training)."""


class LoopConfig(StrictModel):
    """What every loop shares: its length, the size of one step and the validation cadence."""

    max_steps: int = Field(100, gt=0)
    """Training steps."""
    max_minutes: float | None = Field(None, gt=0)
    """A training-time budget: also stop after the step at which the run's training time (each step's
    wall time less its validation, summed over the steps before a resume too) reaches this many minutes.
    That step validates and checkpoints as the last one does. None: only ``max_steps`` ends the run."""
    batch_size: int = Field(8, gt=0)
    """Dataset items (prompts, samples, pairs or texts) per training step."""
    val_every: int = Field(0, ge=0)
    """Validate every N steps and after the last step (0: never)."""
    val_at_start: bool = True
    """Also validate before the first step (the baseline of the learning curve)."""


class MetricsSink(Protocol):
    """Where step metrics go (rl_core.logging.MetricsLogger implements this)."""

    def log(self, metrics: Mapping[str, float], step: int, prefix: str = "train") -> Any: ...

    # Optional: ``log_samples(samples: list[dict], step)`` receives example generations when present;
    # ``resume_from_step(step)`` drops what was logged after ``step`` (called when a run resumes there).


class DataPosition(Protocol):
    """Where the loop is in its data (an EpochSampler or a PromptStream): what a checkpoint stores."""

    @property
    def epoch(self) -> int: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None:
        """Restore the position; ValueError when ``state`` was written for other data."""
        ...


def train_loop(cfg: LoopConfig, policy: TrainingBackend, data: DataPosition, train_step: TrainStep, *,
               validate: Validate | None = None, logger: MetricsSink | None = None,
               checkpointer: CheckpointManager | None = None,
               generation: GenerationBackend | None = None) -> list[Metrics]:
    """Run ``train_step`` for ``cfg.max_steps`` steps (fewer when ``cfg.max_minutes`` of training time run
    out first); returns every logged step's metrics with full names (``train/...``, ``val/...``, ``step``;
    the entry of step 0 holds the validation before training).

    ``generation``: the generation backend that samples with the policy's weights (refitted on resume)."""
    start_step, history = maybe_resume(checkpointer, policy, data, generation, logger)
    validating = validate is not None and cfg.val_every > 0
    if start_step == 0 and validating and cfg.val_at_start:
        history.append(record(logger, {}, validate(0), 0))

    budget_s = None if cfg.max_minutes is None else cfg.max_minutes * 60
    trained_s = sum(training_seconds(m) for m in history)
    for step in range(start_step, cfg.max_steps):
        if budget_s is not None and trained_s >= budget_s:  # a resumed run whose budget was spent
            break
        timer = Timer()
        started = time.perf_counter()
        metrics = train_step(step, timer)
        trained_s += time.perf_counter() - started
        done = step + 1
        out_of_time = budget_s is not None and trained_s >= budget_s
        last = done == cfg.max_steps or out_of_time
        val_metrics: Metrics = {}
        if validating and (done % cfg.val_every == 0 or last):
            with timer.time("validate"):
                val_metrics = validate(done)
        metrics["epoch"] = float(data.epoch)
        metrics.update(timer.pop())
        history.append(record(logger, metrics, val_metrics, done))
        maybe_checkpoint(checkpointer, done, last, policy, data, history, generation)
        if out_of_time:
            log.info("training time %.1f min reached max_minutes=%s after step %d", trained_s / 60, cfg.max_minutes, done)
            break
    return history


def training_seconds(metrics: Metrics) -> float:
    """One logged step's training time: its wall time less its validation (0 for the entry of step 0)."""
    return metrics.get("train/time/total", 0.0) - metrics.get("train/time/validate", 0.0)


def last_step(history: list[Metrics]) -> int:
    """The number of the last step in ``history`` (0 when no step ran)."""
    return int(history[-1]["step"]) if history else 0


def maybe_resume(checkpointer: CheckpointManager | None, policy: TrainingBackend, data: DataPosition,
                 generation: GenerationBackend | None = None,
                 logger: MetricsSink | None = None) -> tuple[int, list[Metrics]]:
    """``(first step to run, metrics history)``: from this run's newest intact checkpoint when resuming
    (a damaged one is skipped with a warning), else fresh. The logger's files are cut back to the
    checkpoint's step, so the resumed run logs each later step once."""
    if checkpointer is None or not checkpointer.cfg.resume:
        return 0, []
    resumed = checkpointer.resume(policy)
    if resumed is None:
        log.info("checkpointing.resume is set but %s holds no checkpoint: starting fresh", checkpointer.dir)
        # An attempt killed before its first checkpoint may have logged steps: all are run again.
        _cut_logs(logger, -1)
        return 0, []
    path, state = resumed
    step = int(state["step"])
    try:
        data.load_state_dict(state["data"])
    except ValueError as e:  # the checkpoint was written for other data
        raise CheckpointError(f"{path}: {e}") from None
    if generation is not None:
        refit(policy, generation)
        restore_draft(generation, path)  # generation.speculative.train_draft: the draft goes on too
    _cut_logs(logger, step)
    print(f"resumed from {path} at step {step}", flush=True)
    return step, list(state["history"])


def _cut_logs(logger: MetricsSink | None, step: int) -> None:
    """Drop what ``logger`` logged after ``step`` (``MetricsLogger.resume_from_step``, when it has it)."""
    resume_from_step = getattr(logger, "resume_from_step", None)
    if resume_from_step is not None:
        resume_from_step(step)


def maybe_checkpoint(checkpointer: CheckpointManager | None, done: int, last: bool, policy: TrainingBackend,
                     data: DataPosition, history: list[Metrics], generation: GenerationBackend | None = None) -> None:
    if checkpointer is not None and checkpointer.should_save(done, last):
        state = {"data": data.state_dict(), "history": history, "metrics": latest_metrics(history)}
        checkpointer.save(done, policy, state, files=draft_files(generation))


def record(logger: MetricsSink | None, train_metrics: Metrics, val_metrics: Metrics, step: int) -> Metrics:
    """Log one step's metrics as ``train/*`` and ``val/*``; returns them merged with those names."""
    if logger is not None:
        if train_metrics:
            logger.log(train_metrics, step, prefix="train")
        if val_metrics:
            logger.log(val_metrics, step, prefix="val")
    merged = {f"train/{k}": float(v) for k, v in train_metrics.items()}
    merged.update({f"val/{k}": float(v) for k, v in val_metrics.items()})
    merged["step"] = float(step)
    return merged


def latest_metrics(history: list[Metrics]) -> Metrics:
    """The last step's metrics, with the most recent value of each validation metric filled in."""
    out: Metrics = {}
    for metrics in history:
        out.update({k: v for k, v in metrics.items() if k.startswith("val/")})
    if history:
        out.update(history[-1])
    return out


def refit(policy: TrainingBackend, generation: GenerationBackend) -> None:
    """Move the policy's current weights into the generation backend."""
    generation.update_weights(policy.named_weights())


# Seeds of consecutive steps / rounds are spaced so that (seed + prompt index) never collides.
_STEP_SEED_STRIDE = 1_000_003
_ROUND_SEED_STRIDE = 10_007


def step_seed(base_seed: int, step: int, round_index: int = 0) -> int:
    """The sampling seed of ``step`` (0-based) and generation round: a pure function, so a resumed
    run samples exactly what an uninterrupted one would."""
    return base_seed * 7919 + step * _STEP_SEED_STRIDE + round_index * _ROUND_SEED_STRIDE
