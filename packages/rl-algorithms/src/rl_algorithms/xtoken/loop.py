"""Cross-tokenizer off-policy distillation on a fixed text dataset.

One step: texts -> tokenised twice (student, teacher) and aligned by character offsets -> the
teacher's top-k logits on its tokenisation (a frozen TrainingBackend), copied to the aligned student
positions -> one optimizer step of the student on KL(teacher || projected student) + cross-entropy.
Validation evaluates the same loss exactly on held-out texts (the student's full distribution is read
through ``topk_logits`` over its whole vocabulary). See docs/distillation.md for the method.
"""

from __future__ import annotations

from collections.abc import Sequence

from rl_algorithms.checkpointing import CheckpointManager
from rl_algorithms.data.sampler import EpochSampler
from rl_algorithms.distill.batch import full_logits
from rl_algorithms.loop_helpers import (
    Metrics,
    MetricsSink,
    in_chunks,
    maybe_checkpoint,
    maybe_resume,
    normalizer_of,
    prefixed,
    record,
    run_validation,
    timed,
    validation_due,
)
from rl_algorithms.losses.xtoken_kl import CrossTokenizerKLLoss
from rl_algorithms.xtoken.batch import XTokenTokenizers, attach_teacher_topk, build_xtoken_batches
from rl_algorithms.xtoken.config import XTokenConfig
from rl_algorithms.xtoken.projection import VocabProjection
from rl_core.batch import Batch
from rl_core.protocols import TrainingBackend
from rl_core.types import ModelOutputs


def xtoken_distill_train(
    cfg: XTokenConfig,
    student: TrainingBackend,
    teacher: TrainingBackend,
    train_texts: Sequence[str],
    tokenizers: XTokenTokenizers,
    projection: VocabProjection,
    *,
    val_texts: Sequence[str] | None = None,
    student_vocab_size: int | None = None,
    logger: MetricsSink | None = None,
    checkpointer: CheckpointManager | None = None,
    seed: int = 0,
) -> list[Metrics]:
    """Distil ``teacher`` into ``student`` across tokenizers for ``cfg.max_steps`` steps.

    ``student_vocab_size`` (the student's logits width) is needed for validation."""
    loss_fn = cfg.build_loss(projection)
    sampler = EpochSampler(len(train_texts), cfg.texts_per_step, seed=seed, shuffle=cfg.shuffle)
    validate = None
    if val_texts:
        if student_vocab_size is None:
            raise ValueError("cross-tokenizer validation needs student_vocab_size (the student's logits width)")
        def validate() -> Metrics:
            return xtoken_validation(cfg, loss_fn, student, teacher, val_texts, tokenizers, student_vocab_size)
    start_step, history = maybe_resume(checkpointer, student, sampler)
    if start_step == 0 and validate is not None and cfg.val_every > 0 and cfg.val_at_start:
        history.append(record(logger, {"step": 0.0, **prefixed("val/", validate())}, 0))

    for step in range(start_step, cfg.max_steps):
        metrics: Metrics = {}
        texts = [train_texts[i] for i in sampler.next_batch()]
        with timed(metrics, "teacher"):
            batch = teacher_scored_batch(teacher, texts, tokenizers, cfg.topk)
        with timed(metrics, "train"):
            metrics.update(prefixed("train/", student.train(batch, loss_fn)))
        done = step + 1
        last = done == cfg.max_steps
        if validation_due(cfg.val_every, done, last):
            run_validation(validate, metrics)
        metrics.update(step=float(done), epoch=float(sampler.epoch))
        history.append(record(logger, metrics, done))
        maybe_checkpoint(checkpointer, done, last, student, sampler, history)
    return history


def teacher_scored_batch(teacher: TrainingBackend, texts: Sequence[str], tokenizers: XTokenTokenizers, k: int) -> Batch:
    """The student batch of ``texts`` with the teacher's top-k at every aligned position."""
    student_batch, teacher_batch = build_xtoken_batches(texts, tokenizers)
    values, indices = teacher.topk_logits(teacher_batch, k)
    return attach_teacher_topk(student_batch, values, indices)


def xtoken_validation(cfg: XTokenConfig, loss_fn: CrossTokenizerKLLoss, student: TrainingBackend,
                      teacher: TrainingBackend, texts: Sequence[str], tokenizers: XTokenTokenizers,
                      student_vocab_size: int) -> Metrics:
    """The training loss and its parts (``xtoken_kl``, ``ce``) over held-out texts, no gradient."""
    batches = [teacher_scored_batch(teacher, chunk, tokenizers, cfg.topk) for chunk in in_chunks(texts, cfg.val_batch_size)]
    normalizer = normalizer_of(batches)
    totals: Metrics = {}
    for batch in batches:
        outputs = ModelOutputs(logprobs=student.logprobs(batch).float(),
                               logits=full_logits(student, batch, student_vocab_size, 1.0))
        loss, metrics = loss_fn(outputs, batch, normalizer)
        for key, value in {"loss": float(loss), **metrics}.items():
            totals[key] = totals.get(key, 0.0) + value
    return totals
