"""The driver of the supervised-style loops (SFT, DPO, reward model, on-policy and cross-tokenizer distillation).

Each draws ``batch_size`` dataset items per step from an :class:`~rl_algorithms.data.EpochSampler`,
turns them into a batch with its own ``make_batch`` and takes one optimizer step on its loss; the rest
(resume, validation cadence, metrics, checkpoints) is :func:`rl_algorithms.loop.train_loop`. What differs
between the recipes is only the batch maker, the loss and the validation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from pydantic import Field

from rl_algorithms.checkpointing import CheckpointManager
from rl_algorithms.data.sampler import EpochSampler
from rl_algorithms.draft import speculative_metrics, train_draft
from rl_algorithms.loop import LoopConfig, Metrics, MetricsSink, Validate, refit, train_loop
from rl_core.batch import Batch
from rl_core.protocols import GenerationBackend, LossFn, TrainingBackend
from rl_core.timer import Timer
from rl_core.types import ModelOutputs, Normalizer

T = TypeVar("T")
MakeBatch = Callable[[list[T], int, Timer], tuple[Batch, Metrics]]
"""``make_batch(items, step, timer) -> (batch, extra step metrics)``; phases it runs are timed in ``timer``."""


class SupervisedLoopConfig(LoopConfig):
    """A loop over a fixed dataset: shuffling and the validation batch size on top of :class:`LoopConfig`."""

    shuffle: bool = True
    """Visit the training items in a fresh seeded order each epoch."""
    val_batch_size: int = Field(8, gt=0)
    """Held-out items per forward pass (or generation call) during validation."""


def supervised_train(cfg: SupervisedLoopConfig, policy: TrainingBackend, items: Sequence[T], make_batch: MakeBatch,
                     loss_fn: LossFn, *, validate: Validate | None = None, logger: MetricsSink | None = None,
                     checkpointer: CheckpointManager | None = None, seed: int = 0,
                     generation: GenerationBackend | None = None, temperature: float = 1.0) -> list[Metrics]:
    """Train ``policy`` for ``cfg.max_steps`` steps of ``cfg.batch_size`` items each; returns every step's
    metrics. ``generation`` (on-policy recipes) is refitted with the new weights after every step."""
    sampler = EpochSampler(len(items), cfg.batch_size, seed=seed, shuffle=cfg.shuffle)

    def train_step(step: int, timer: Timer) -> Metrics:
        batch, metrics = make_batch([items[i] for i in sampler.next_batch()], step, timer)
        with timer.time("train"):
            metrics.update(policy.train(batch, loss_fn, temperature=temperature))
        if generation is not None:
            with timer.time("refit"):
                refit(policy, generation)
            metrics.update(speculative_metrics(generation))
            metrics.update(train_draft(generation, batch))  # speculative.train_draft: the draft follows the policy
        return metrics

    return train_loop(cfg, policy, sampler, train_step, validate=validate, logger=logger, checkpointer=checkpointer,
                      generation=generation)


def evaluate_loss(loss_fn: LossFn, batches: Sequence[Batch], outputs_of: Callable[[Batch], ModelOutputs],
                  extra: Callable[[Batch, Normalizer], Metrics] | None = None) -> Metrics:
    """The loss and its metrics over all of ``batches`` (no gradient): ``loss_fn`` on ``outputs_of(batch)``.

    Every batch uses the normaliser of the whole set, so the per-batch values sum to the full-set
    averages (as micro-batches do in training). ``extra(batch, normalizer)`` adds more summed metrics."""
    normalizer = normalizer_of(batches)
    totals: Metrics = {}
    for batch in batches:
        loss, metrics = loss_fn(outputs_of(batch), batch, normalizer)
        more = extra(batch, normalizer) if extra is not None else {}
        for key, value in {"loss": float(loss), **metrics, **more}.items():
            totals[key] = totals.get(key, 0.0) + value
    return totals


def in_chunks(items: Sequence[T], size: int) -> list[Sequence[T]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def normalizer_of(batches: Sequence[Batch]) -> Normalizer:
    """Global denominators over several batches (evaluated chunk by chunk, summed like micro-batches)."""
    tokens = sum(float(b["loss_mask"].sum()) for b in batches)
    sequences = sum(float((b["loss_mask"].sum(dim=1) > 0).sum()) for b in batches)
    return Normalizer(num_valid_tokens=max(tokens, 1.0), num_valid_sequences=max(sequences, 1.0))
