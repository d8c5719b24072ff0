"""Pieces shared by the supervised-style loops (SFT, DPO, reward model, distillation).

Each of those loops draws batches of dataset indices from an :class:`~rl_algorithms.data.EpochSampler`,
takes one optimizer step per batch, validates every ``val_every`` steps and checkpoints through the
:class:`~rl_algorithms.checkpointing.CheckpointManager` that GRPO uses (policy + data position + RNG).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Protocol, TypeVar

from rl_algorithms.checkpointing import CheckpointManager
from rl_algorithms.data.sampler import EpochSampler
from rl_core.batch import Batch
from rl_core.protocols import GenerationBackend, TrainingBackend
from rl_core.types import Normalizer

log = logging.getLogger(__name__)

Metrics = dict[str, float]
T = TypeVar("T")



class MetricsSink(Protocol):
    """Where step metrics go (rl_core.logging.MetricsLogger implements this)."""

    def log(self, metrics: Mapping[str, float], step: int, prefix: str = "train") -> dict[str, float]: ...


def record(logger: MetricsSink | None, metrics: Metrics, step: int) -> Metrics:
    """Log ``metrics`` (names already prefixed: ``train/``, ``val/``, ``time/``) at ``step``; return them."""
    if logger is not None:
        logger.log(metrics, step, prefix="")
    return metrics


@contextmanager
def timed(metrics: Metrics, phase: str) -> Iterator[None]:
    """Add the wall time of the block to ``metrics['time/<phase>']``."""
    start = time.perf_counter()
    try:
        yield
    finally:
        metrics[f"time/{phase}"] = metrics.get(f"time/{phase}", 0.0) + time.perf_counter() - start


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


def step_seed(base_seed: int, step: int) -> int:
    """The sampling seed of ``step``: a pure function, so a resumed run samples what an uninterrupted one would."""
    return base_seed * 7919 + step * 1_000_003


def prefixed(prefix: str, metrics: Metrics) -> Metrics:
    return {f"{prefix}{key}": float(value) for key, value in metrics.items()}


def validation_due(val_every: int, done: int, last: bool) -> bool:
    """Validate every ``val_every`` completed steps and after the last one (never when 0)."""
    return val_every > 0 and (done % val_every == 0 or last)


def load_latest(checkpointer: CheckpointManager | None, policy: TrainingBackend) -> tuple[str, dict] | None:
    """``(path, trainer state)`` of the latest checkpoint, loaded into ``policy``, when resuming;
    None for a fresh start (resume off, or no checkpoint yet)."""
    if checkpointer is None or not checkpointer.cfg.resume:
        return None
    latest = checkpointer.latest()
    if latest is None:
        log.info("checkpointing.resume is set but %s holds no checkpoint: starting fresh", checkpointer.dir)
        return None
    return latest, checkpointer.load(latest, policy)


def maybe_resume(checkpointer: CheckpointManager | None, policy: TrainingBackend,
                 sampler: EpochSampler) -> tuple[int, list[Metrics]]:
    """``(first step to run, metrics history)``: from the latest checkpoint when resuming, else fresh."""
    loaded = load_latest(checkpointer, policy)
    if loaded is None:
        return 0, []
    latest, state = loaded
    if state["data"].get("num_items", sampler.num_items) != sampler.num_items:
        raise ValueError(f"{latest} was written for {state['data']['num_items']} training items but the data now "
                         f"holds {sampler.num_items}: resume with the same data settings")
    sampler.load_state_dict(state["data"])
    log.info("resumed from %s (step %d)", latest, state["step"])
    return int(state["step"]), list(state["history"])


def maybe_checkpoint(checkpointer: CheckpointManager | None, done: int, last: bool, policy: TrainingBackend,
                     sampler: EpochSampler, history: list[Metrics]) -> None:
    if checkpointer is not None and checkpointer.should_save(done, last):
        data = {**sampler.state_dict(), "num_items": sampler.num_items}
        checkpointer.save(done, policy, {"data": data, "history": history, "metrics": latest_metrics(history)})


def in_chunks(items: Sequence[T], size: int) -> list[Sequence[T]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def run_validation(validate: Callable[[], Metrics] | None, metrics: Metrics) -> None:
    """Add ``val/...`` metrics (and the time they took) to ``metrics``."""
    if validate is None:
        return
    with timed(metrics, "validate"):
        metrics.update(prefixed("val/", validate()))


def normalizer_of(batches: Sequence[Batch]) -> Normalizer:
    """Global denominators over several batches (evaluated chunk by chunk, summed like micro-batches)."""
    tokens = sum(float(b["loss_mask"].sum()) for b in batches)
    sequences = sum(float((b["loss_mask"].sum(dim=1) > 0).sum()) for b in batches)
    return Normalizer(num_valid_tokens=max(tokens, 1.0), num_valid_sequences=max(sequences, 1.0))
